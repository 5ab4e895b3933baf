"""Entry point of a rank of a sweep that ``python sweep.py`` started
(``python -m hpckit.sweep.worker``): all of the sweep's ranks on this node
(:mod:`hpckit.sweep.trialqueue`), or one trial's job step in a Slurm allocation
(:mod:`hpckit.sweep.allocated`). Nothing imports it."""

from __future__ import annotations

import os
import pickle
from typing import Any

from hpckit import exits, logs
from hpckit import settings as _settings
from hpckit.errors import LaunchError, TrainingFailedError
from hpckit.launch.mainimport import enter
from hpckit.run.mpi.comm import world
from hpckit.run.startup.watchdog import start_heartbeat
from hpckit.sweep.decisions import Files, serving
from hpckit.sweep.trialqueue import TUNER
from hpckit.sweep.trialsteps import assignment_path, write_outcome


def main() -> None:
    current = _settings.refresh()
    if not current.sweep_payload:
        raise LaunchError("hpckit.sweep.worker is started by Tuner.fit(), not by hand")
    start_heartbeat(current)
    enter(current.sweep_payload)
    with open(os.path.join(current.sweep_payload, TUNER), "rb") as f:
        tuner = pickle.load(f)
    if current.sweep_trial is None:
        tuner.fit()
    else:
        run_one_trial(tuner, current.sweep_trial, current.sweep_payload)


def run_one_trial(tuner: Any, index: int, payload: str) -> None:
    """The trial ``index`` on this job step's ranks, as the sweep's process assigned it; its
    reports go to that process through the payload folder; rank 0 writes how it ended. The
    Tuner's own rank side, so it uses the Tuner's private steps."""
    location = tuner._location(_settings.current())  # noqa: SLF001
    with open(assignment_path(payload, index), "rb") as f:
        assignment = pickle.load(f)
    comm = world()
    logs.configure(comm.rank)
    # As fit() under srun: a failure ends the step, and the sweep's process counts it (the
    # ranks do not restart themselves, so one counter spends max_failures).
    with serving(Files(payload, index)):
        try:
            ended = tuner._attempt(assignment, location, None, failures_end_step=True)  # noqa: SLF001
        except TrainingFailedError:  # every rank raised it: logged, and recorded as FAILED
            raise SystemExit(exits.FAILED) from None
    if comm.rank == 0:
        write_outcome(payload, ended)


if __name__ == "__main__":
    main()
