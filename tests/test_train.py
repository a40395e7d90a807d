"""The entry point's own duties: SIGTERM stops at once, leaving the stacks and one line."""
import signal

import pytest


def test_sigterm_raises_terminated_exits_143_and_leaves_the_stacks(tmp_path, capsys, monkeypatch):
    from ddp_lab.train import Terminated, stop_on_sigterm
    monkeypatch.setenv("RANK", "1")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm(tmp_path)
        with pytest.raises(Terminated) as e:
            signal.raise_signal(signal.SIGTERM)
        assert e.value.code == 143
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one kills outright
    finally:
        signal.signal(signal.SIGTERM, previous)
    stacks = tmp_path / "stacks" / "rank1.txt"
    assert "test_sigterm_raises_terminated" in stacks.read_text()
    err = capsys.readouterr().err
    assert "ddp_lab: rank 1 stopped at step" in err
    assert f"SIGTERM (torchrun stops every rank when one fails); stacks in {stacks}" in err
