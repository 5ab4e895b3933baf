"""Entry point of a rank started by hpckit itself: ``python -m hpckit.launch.worker``."""

from __future__ import annotations

import os
import pickle
import re

from hpckit import settings, uncaught
from hpckit.errors import LaunchError
from hpckit.launch.mainimport import enter, not_at_top_level
from hpckit.launch.spawn import RETURNED
from hpckit.run.ending.exit import ErrorReport, write_error
from hpckit.run.job import TrainingJob
from hpckit.run.mpi.comm import RankFailure, world
from hpckit.run.ranks import run_ranks, start_mpi
from hpckit.settings import Settings

# pickle's words for a name the rank's import of the script (as __mp_main__) lacks
_NOT_IN_SCRIPT = re.compile(r"attribute '([^']+)' on <module '__mp_main__' from '([^']+)'>")


def main() -> None:
    current = settings.refresh()
    if not current.worker:
        raise LaunchError("hpckit.launch.worker is started by a trainer's fit(), not by hand")
    start_mpi(current)  # before the script's imports: every rank comes to MPI_Init at once
    enter(current.worker)
    result = run_ranks(_job(current), current)
    if world().rank == 0:  # rank 0's return value, for fit() in the parent
        with open(os.path.join(current.worker, RETURNED), "wb") as f:
            pickle.dump(result.return_value, f)


def _job(current: Settings) -> TrainingJob:
    """The job fit() handed the ranks. A name of the script that pickle cannot find in the
    rank's import of it (a training function defined under ``if __name__ == "__main__":``)
    is one error that names it, handed to the launching process, which says it once."""
    try:
        with open(os.path.join(current.worker or "", "job.pkl"), "rb") as f:
            job: TrainingJob = pickle.load(f)
    except AttributeError as exc:
        missing = _NOT_IN_SCRIPT.search(str(exc))
        if missing is None or current.worker is None:
            raise
        error = LaunchError(not_at_top_level(missing.group(1), missing.group(2)))
        rank = int(current.launched_rank) if current.launched_rank.isdigit() else 0
        write_error(current.worker, ErrorReport(RankFailure.capture(rank, error), training=False))
        raise uncaught.shown_elsewhere(error) from None
    return job


if __name__ == "__main__":
    main()
