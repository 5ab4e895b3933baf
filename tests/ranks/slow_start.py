"""steady.py, started the way the docs advise (hpckit imported first), with a slow start-up on
the first run: each rank leaves a marker and sleeps before importing torch, so that a test can
send the stop signal while the ranks are still starting. ``DIE_RANK`` makes that rank exit
during start-up instead (with ``--die``)."""

import os
import sys
import time

import hpckit  # noqa: F401  (first: from here on the stop signal is caught)

if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" and os.environ.get("SLOW_START_MARKER"):
    open(f"{os.environ['SLOW_START_MARKER']}.{os.environ['SLURM_PROCID']}", "w").close()
    time.sleep(float(os.environ.get("SLOW_START_SECONDS", "8")))
if os.environ.get("DIE_RANK") == os.environ.get("SLURM_PROCID"):
    time.sleep(3)  # the others are in fit() by now
    sys.exit("rank died during start-up (injected by the test)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import steady  # noqa: E402

steady.main()
