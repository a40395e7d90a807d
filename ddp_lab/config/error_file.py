"""A rank's last line as torchrun's root cause: torchelastic's error file.

torchrun gives each worker a path in TORCHELASTIC_ERROR_FILE; when workers fail
it reads each one's file into `ProcessFailure.message` and prints the earliest
(by the file's timestamp) as "Root Cause". A worker that wrote none is shown as
`error_file: <N/A>` and a link. torch's `@record` writes the file only for an
exception leaving the entry point, while ddp_lab's failures end with one line
said and sys.exit (a refusal, exit 2) or os._exit (the watchdog, a deadline).
So every place that says a rank's last line also calls `write(line)`.

The first line written stays: each rank's first line is its cause, and what
follows it (a closed connection, the unwinding) is a consequence. torch's own
handler overwrites (record_exception opens with "w"), so `@record` in
ddp_lab.train gets `KeepFirst`.
"""
from __future__ import annotations

import json
import os
import threading
import time

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

ENV = "TORCHELASTIC_ERROR_FILE"


def write(line: str) -> bool:
    """`line` into this rank's error file, in the JSON ErrorHandler.record_exception
    writes; only under torchrun (ENV set), and never over an existing file. Whether it
    was written."""
    path = os.environ.get(ENV)
    if not path:
        return False
    # no "py_callstack": torchrun then prints "message", our line, as the traceback;
    # the timestamp is whole seconds (torchrun parses it with int())
    data = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f)
        # link: atomic, and it refuses an existing file. The agent reads this file as
        # JSON (a parse error fails the agent), so it is never seen half written, and a
        # second thread's line (the watchdog's, the training thread's) loses cleanly.
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: exclusive create instead
            with open(path, "x") as f:
                json.dump(data, f)
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class KeepFirst(ErrorHandler):
    """`@record`'s handler, but an error file already written (ddp_lab's line) stays."""

    def record_exception(self, e: BaseException) -> None:
        path = self._get_error_file_path()
        if path and os.path.exists(path):
            return
        super().record_exception(e)
