"""What a run that lost the experiment's lock is told: who took the experiment over, and what
to do. Said once, as the one error every rank raises at the next ``report()``
(:class:`~hpckit.errors.ExperimentTakenError`), so it names the run that owns the experiment
now, and says that this run wrote nothing more and should not be restarted.

The run that took over may have ended and removed its lock by the time this one wakes: it is
then named from the newest attempt the manifest records that is not this run's.
"""

from __future__ import annotations

import time

from hpckit.errors import HpckitError
from hpckit.experiment.reading import read_manifest
from hpckit.logs import log
from hpckit.storage.location import Location

Me = tuple[str, int]  # this run's rank 0: host and pid


def taken_over(lock: Location, mine: str, me: Me, holder: str | None, unrefreshed: float,
               stale_after: float) -> str:
    """Another run's token (``holder``: its description; None where the ``lock`` file is gone
    or unreadable) was found where this run's should be."""
    experiment = lock.parent
    who = holder or _newest_other(experiment, me, f"its lock file {lock.display} is gone")
    why = (f"had not refreshed its lock for {unrefreshed:.0f} s (HPCKIT_LOCK_STALE_SECONDS="
           f"{stale_after:g}: was this job frozen, or cut off from its storage?)"
           if unrefreshed >= stale_after else "held the lock, which was replaced or removed")
    return (f"experiment {experiment.display} was taken over by another run ({who}) while this "
            f"run (rank 0: {mine}) {why}. {_what_now(experiment)}")


def lapsed(experiment: Location, mine: str, unrefreshed: float, stale_after: float,
           error: BaseException) -> str:
    """No refresh succeeded for the stale time: another run may take the experiment over."""
    return (f"rank 0 ({mine}) could not refresh the lock of experiment {experiment.display} for "
            f"{unrefreshed:.0f} s (HPCKIT_LOCK_STALE_SECONDS={stale_after:g}; last error: "
            f"{error!r}), so another run may have taken it over. {_what_now(experiment)}")


def _what_now(experiment: Location) -> str:
    return ("This run stopped at its next report without writing anything more, and is not "
            "restarted: the experiment belongs to the other run now (let it finish). Then run "
            f"hpckit verify {experiment.display}: a write this run had under way when it lost "
            "the lock may have landed.")


def _newest_other(experiment: Location, me: Me, gone: str) -> str:
    """The run named by the newest attempt in the manifest that is not this run's."""
    try:
        manifest = read_manifest(experiment)
    except HpckitError as exc:
        log.debug("could not read %s to name the run that took it over: %s",
                  experiment.display, exc)
        return gone
    others = [a for a in (manifest.attempts if manifest else ()) if (a.host, a.pid) != me]
    if not others:
        return gone
    last = others[-1]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.started_at))
    job = f", Slurm job {last.slurm['job_id']}" if last.slurm.get("job_id") else ""
    return (f"host {last.host}, pid {last.pid}{job}, attempt {last.attempt} started {started}, "
            f"now {last.status.value}; {gone}")
