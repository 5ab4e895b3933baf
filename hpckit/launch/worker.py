"""Entry point of a rank started by hpckit itself: ``python -m hpckit.launch.worker``."""

from __future__ import annotations

import os
import pickle

from hpckit import settings
from hpckit.errors import LaunchError
from hpckit.launch.mainimport import enter
from hpckit.launch.spawn import RETURNED
from hpckit.run.mpi.comm import world
from hpckit.run.ranks import run_ranks
from hpckit.run.startup import beating


def main() -> None:
    current = settings.refresh()
    if not current.worker:
        raise LaunchError("hpckit.launch.worker is started by a trainer's fit(), not by hand")
    beating.start(current)
    enter(current.worker)
    with open(os.path.join(current.worker, "job.pkl"), "rb") as f:
        job = pickle.load(f)
    result = run_ranks(job, current)
    if world().rank == 0:  # rank 0's return value, for fit() in the parent
        with open(os.path.join(current.worker, RETURNED), "wb") as f:
            pickle.dump(result.return_value, f)


if __name__ == "__main__":
    main()
