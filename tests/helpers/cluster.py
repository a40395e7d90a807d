"""Shared by the emulated cluster's tests."""
import time


def wait_for(condition, job, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert None in job.poll(), f"the job ended before {what}:\n{job.output()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s:\n{job.output()[-3000:]}"
        time.sleep(0.05)
