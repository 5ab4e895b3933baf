"""steady.py, started the way the docs advise (hpckit imported first), with a slow start-up on
the first run: each rank leaves a marker and, before importing torch, waits until the stop
signal the test sends has arrived, so that it arrives while the ranks are still starting.
``DIE_RANK`` makes that rank exit during start-up instead, once the others are in ``fit()``
(they have registered their PIDs) and their start-up watchdogs have looked at it."""

import os
import sys
import time

import hpckit  # noqa: F401  (first: from here on the stop signal is caught)
from hpckit.run.ending import stop
from hpckit.run.startup.watchdog import POLL

LIMIT_S = 60  # the test fails on its own timeouts long before this


def wait_until(done, what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not done():
        if time.monotonic() > deadline:
            sys.exit(f"slow_start.py: {what} did not happen within {LIMIT_S} s")
        time.sleep(0.05)


if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" and os.environ.get("SLOW_START_MARKER"):
    open(f"{os.environ['SLOW_START_MARKER']}.{os.environ['SLURM_PROCID']}", "w").close()
    wait_until(lambda: stop.received() is not None, "the test's stop signal")
if os.environ.get("DIE_RANK") is not None:
    storage = sys.argv[sys.argv.index("--storage") + 1]
    pids = os.path.join(storage, f"pids-{os.environ['SLURM_JOB_ID']}")
    os.makedirs(pids, exist_ok=True)
    os.environ["HPCKIT_PID_DIR"] = pids  # read when fit() starts, below
    if os.environ["DIE_RANK"] == os.environ["SLURM_PROCID"]:
        others = int(os.environ["SLURM_NTASKS"]) - 1
        wait_until(lambda: len(os.listdir(pids)) >= others, "the other ranks' start")
        # Their start-up watchdogs look at the node's ranks every POLL seconds: dying once
        # they have looked, it is named (a rank that died before any look is "rank ?").
        time.sleep(2 * POLL)
        sys.exit("rank died during start-up (injected by the test)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import steady  # noqa: E402

steady.main()
