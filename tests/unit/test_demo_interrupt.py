"""The demo stays up until Ctrl-C, even when it was started with SIGINT ignored.

A process started in the background of a non-interactive shell (``cmd &``, a CI job, ``nohup``)
inherits SIGINT as ignored, and Python then raises no KeyboardInterrupt: "Ctrl-C stops everything"
must not depend on how the demo was started.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

WAITS = """
import signal, sys
from revgate.flows.processes import wait_for_interrupt
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as inherited from a background shell
print("waiting", flush=True)
wait_for_interrupt()
print("stopped", flush=True)
"""


def catches(pid: int, *signums: int) -> bool:
    """Whether the process has a handler installed for every one of ``signums`` (its SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return all(mask & (1 << (signum - 1)) for signum in signums)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_wait_for_interrupt_ends_on_the_signal_even_when_sigint_was_ignored(signum: int) -> None:
    process = subprocess.Popen([sys.executable, "-c", WAITS], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "waiting\n"
        deadline = time.monotonic() + 30
        while not catches(process.pid, signal.SIGINT, signal.SIGTERM):  # the handlers go in just after the line
            assert time.monotonic() < deadline, "no SIGINT and SIGTERM handlers after 30 s: the signal would be lost"
            time.sleep(0.02)
        process.send_signal(signum)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo kept waiting after the signal")
        assert code == 0
        assert process.stdout.read() == "stopped\n"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
