"""The end of a run that a stop request stopped, after the checkpoint that followed it:
requeued under Slurm and exit 75, or ``PreemptionError`` on every rank, as Ray raises."""

from __future__ import annotations

from hpckit import exits, uncaught
from hpckit.errors import PreemptionError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.experiment import Experiment
from hpckit.logs import log
from hpckit.run.ending import stop
from hpckit.run.job import TrainingJob
from hpckit.run.mpi.waiting import from_root
from hpckit.run.session.preemption import not_requeued_after, preemption_info
from hpckit.run.session.session import Session
from hpckit.settings import Settings


def end_stopped_run(job: TrainingJob, session: Session, experiment: Experiment | None,
              settings: Settings, signal_name: str) -> None:
    """After the checkpoint that followed a stop request: requeue under Slurm (up to
    FailureConfig.max_preemption_failures times) and exit 75; not requeued, raise
    PreemptionError on every rank (as Ray does), which exits 75 if uncaught."""
    limit = job.run_config.failure_config.max_preemption_failures
    requeued = False
    if experiment is not None:
        reason = f"stop requested by {signal_name}"
        reports = session.protocol.reports
        requeue = settings.job_to_requeue
        before = sum(a.status is AttemptStatus.REQUEUED for a in experiment.manifest.attempts)
        refused = requeue and not_requeued_after(signal_name, settings)
        if refused:
            requeue = None
            reason += f"; not requeued: {refused}"
        elif requeue and limit != -1 and before >= limit:
            requeue = None
            reason += (f"; not requeued: FailureConfig(max_preemption_failures={limit}) reached "
                       f"after {before} requeue(s)")
        # Recorded before asking: Slurm may end this job as soon as it requeues it.
        experiment.end_attempt(AttemptStatus.REQUEUED if requeue else AttemptStatus.STOPPED, reason, reports)
        requeued = bool(requeue) and stop.requeue(settings)
        if not requeued:
            if requeue:
                experiment.end_attempt(AttemptStatus.STOPPED, reason, reports)
            latest = session.protocol.latest
            log.warning("stopped after committing %s (%s). To continue, %s",
                        latest.uri if latest else "-", reason,
                        stop.how_to_resume(experiment.location.display, not job.timestamped))
    comm = session.protocol.comm
    if from_root(comm, requeued):
        raise SystemExit(exits.STOPPED)
    raise uncaught.shown_elsewhere(PreemptionError(preemption_info(comm, session, settings)))
