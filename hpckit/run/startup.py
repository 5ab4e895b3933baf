"""What a launched rank does before MPI starts, as early as hpckit runs in it."""

from __future__ import annotations

from hpckit import settings as _settings
from hpckit.errors import HpckitError
from hpckit.logs import log
from hpckit.run import shm, stop


def early() -> None:
    """At ``import hpckit``: in a rank of a launcher or a Slurm job, catch the stop signal
    from now on, and clear a killed incarnation's shared memory before anything can start
    MPI. Never raises: importing hpckit must not fail, and fit() reports bad settings."""
    try:
        current = _settings.current()
    except HpckitError:
        return
    if current.launcher is None and current.slurm_job_id is None:
        return
    stop.catch_early(current.stop_signal)
    try:
        shm.clear_stale_segments(current)
    except OSError as exc:
        log.warning("could not check for stale MPICH shared memory: %s", exc)
