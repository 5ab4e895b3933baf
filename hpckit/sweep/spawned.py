"""A sweep packed under ``python sweep.py``: hpckit starts ``TuneConfig(max_concurrent_trials)``
groups of a trial's ranks under mpiexec on this node, and each rank re-runs the script as a
trainer's spawned ranks do (:mod:`hpckit.launch.mainimport`), then packs the trials as under
mpirun (:mod:`hpckit.sweep.trialqueue`). This process waits, passes signals on, and reads the
sweep's results from its manifest when the ranks are done.

The ranks' entry point is :mod:`hpckit.sweep.worker`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from typing import Any

from hpckit import exits, uncaught
from hpckit.errors import TrainingFailedError
from hpckit.launch.process import mpiexec, run_process, started_for
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.job import write_payload
from hpckit.settings import Settings, variable

TUNER = "tuner.pkl"


def run_spawned(tuner: Any, ranks: int, settings: Settings) -> None:
    """Run ``tuner.fit()`` on ``ranks`` ranks that hpckit starts; returns when they finished
    the sweep, raises as the ranks ended otherwise."""
    launch = mpiexec(settings, ranks, [sys.executable, "-m", "hpckit.sweep.worker"])
    payload = tempfile.mkdtemp(prefix="hpckit-sweep-", dir=settings.local_dir)
    try:
        write_payload(payload, tuner, TUNER, "the Tuner",
                      "define the training function at module level (not a lambda or a "
                      "nested function) and keep param_space picklable")
        log.info("starting %d rank(s) for the sweep's trials", ranks)
        code = run_process(launch, {variable("sweep_payload"): payload,
                                     variable("progress"): "0",  # this process shows it
                                     variable("started_at"): started_for(0, settings)}, settings)
    except KeyboardInterrupt:
        code = exits.INTERRUPTED
    finally:
        shutil.rmtree(payload, ignore_errors=True)
    if code == exits.INTERRUPTED:
        log.warning("sweep interrupted; finished trials are kept and interrupted ones resume "
                    "from their latest checkpoints. To go on, run the same command again.")
        stop.interrupt_handled()
        raise uncaught.shown_elsewhere(KeyboardInterrupt())
    if code == exits.STOPPED:
        raise SystemExit(exits.STOPPED)
    if code != 0:
        raise TrainingFailedError(
            f"the sweep's ranks exited with status {code} (a rank was killed, or failed alone; "
            "see the output above). Run the same command again: the sweep resumes.")
