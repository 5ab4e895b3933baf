"""What a launched rank does before MPI starts, as early as hpckit runs in it."""

from __future__ import annotations

import time

from hpckit import processes
from hpckit import settings as _settings
from hpckit.errors import HpckitError
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.startup import hook, shm

IMPORTED_AT = time.time()
_first = True


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
    if hook.choose_mpich_network():  # where the start-up hook was turned off
        log.debug("chose MPICH's OFI network module: Slurm's PMI server cuts UCX's requests")
    try:
        shm.clear_stale_segments(current)
    except HpckitError:
        pass  # fit() looks again and raises it, as one line
    except OSError as exc:
        log.warning("could not check for stale MPICH shared memory: %s", exc)


def ready_since(settings: _settings.Settings, began: float) -> tuple[float, str]:
    """What the "ready in" of an attempt that ``began`` (opened its experiment) counts from.

    The first attempt of a process counts from the start of the user's command: for ranks
    that hpckit started, their parent's start ($HPCKIT_STARTED_AT); else this process's
    (off Linux, when hpckit was imported). A later one (a restart, or another ``fit()`` in
    the same program) counts from when it began."""
    global _first
    if not _first:
        return began, "since the attempt began"
    _first = False
    return process_started(settings), "since the command started"


def process_started(settings: _settings.Settings) -> float:
    """When the user's command started, for the ranks that hpckit starts."""
    return settings.started_at or processes.started_at() or IMPORTED_AT
