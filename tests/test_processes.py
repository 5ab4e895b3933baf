"""The harness's own process handling: a command past its timeout fails at that timeout, with
nothing it started left running, even a process in a session of its own that holds the
command's output open (as the ranks under hpckit's launcher do)."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import run

from hpckit.processes import alive

HOLDER = """
import subprocess, sys, time
held = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                        start_new_session=True)
print("HOLDER", held.pid, flush=True)
time.sleep(120)
"""

pytestmark = pytest.mark.quick


def test_a_command_past_its_timeout_is_ended_with_everything_under_it():
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"timed out after 5 s") as failed:
        run([sys.executable, "-c", HOLDER], timeout=5)
    assert time.monotonic() - started < 60, "the test waited for the held output pipe"
    held = int(str(failed.value).split("HOLDER ")[1].split()[0])
    deadline = time.monotonic() + 10  # SIGKILL is sent; the process ends a moment later
    while alive(held) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(held), f"pid {held}, in a session of its own, outlived the command"
