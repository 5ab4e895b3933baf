"""The harness's own process handling: a command past its timeout fails at that timeout, with
nothing it started left running, even a process in a session of its own that holds the
command's output open (as the ranks under hpckit's launcher do); and each line a process
prints reaches the output whole, whatever its other threads write meanwhile."""

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

SPEAKERS = """
import json, sys, threading
def log():
    while True:
        sys.stderr.write("a log line from another thread\\n")
threading.Thread(target=log, daemon=True).start()
for n in range(3000):
    print("MARK " + json.dumps({"n": n}))
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


def test_a_printed_line_is_not_split_by_what_another_thread_writes():
    """Stop 72's CI: unbuffered, ``print`` wrote its text and its newline apart, and a log line
    landed between them (tests/support/whole_lines)."""
    output = run([sys.executable, "-c", SPEAKERS], timeout=60).output
    marks = [line for line in output.splitlines() if "MARK " in line]
    assert marks == [f'MARK {{"n": {n}}}' for n in range(3000)], \
        [line for line in marks if not line.endswith("}")][:5]
