"""The parent side of ``python train.py`` with num_workers > 1: start the ranks (on this node
under mpiexec, or across a Slurm allocation with srun: :mod:`hpckit.launch.steps`), wait, read
what failed, and start them again as the retry policy allows.

The ranks are handed the pickled :class:`~hpckit.run.job.TrainingJob` and re-run the user's
script as multiprocessing's spawn does (see :mod:`hpckit.launch.mainimport`).
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
from typing import Any, NoReturn

from hpckit import exits, uncaught
from hpckit.errors import (
    ExperimentTakenError,
    HpckitError,
    NoSpareNode,
    PreemptionError,
    TrainingFailedError,
    WorkerGroupError,
)
from hpckit.experiment.artifacts import HUNG
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.experiment import end_abandoned_attempt
from hpckit.experiment.opening import prepare
from hpckit.experiment.reading import read_manifest
from hpckit.experiment.tracking import end_recorded
from hpckit.launch import elastic, heartbeat
from hpckit.launch.process import Launch, run_process, started_for
from hpckit.launch.steps import (
    Next,
    Steps,
    after_failure,
    requeued_instead,
    steps_for,
    warn_of_idle_spares,
)
from hpckit.logs import log
from hpckit.result import Result, result_read
from hpckit.run.ending import stop
from hpckit.run.ending.exit import ERRORS, read_errors
from hpckit.run.ending.retry import RetryPolicy, causes
from hpckit.run.job import TrainingJob, write_payload
from hpckit.run.mpi.comm import describe
from hpckit.run.ranks import configure_logs
from hpckit.settings import Settings, variable
from hpckit.storage.location import Location

# Not in hpckit.launch.worker: importing that module here would import it before
# ``python -m hpckit.launch.worker`` runs it, and runpy warns about that on every rank.
RETURNED = "returned.pkl"  # rank 0's return value, in the launch payload

def spawn(job: TrainingJob, settings: Settings) -> Result:
    """Start the ranks (``num_workers``, and those set aside to validate); restart them on
    failure."""
    configure_logs(0, job, settings)
    n = job.launched_ranks
    job = job.resumed(settings)[0]
    named = bool(job.run_config.name or settings.name)
    job = job.named(settings)
    experiment = job.storage_root(settings).join(job.name)
    read_manifest(prepare(experiment.parent, job.name))  # storage and manifest, before ranks
    program = [sys.executable, "-m", "hpckit.launch.worker"]
    steps = elastic.steps_for(settings, job, program, experiment) or \
        steps_for(settings, n, program)
    policy = RetryPolicy(job.run_config.failure_config.max_failures)
    warn_of_idle_spares(steps, policy, "FailureConfig(max_failures)")
    payload = tempfile.mkdtemp(prefix=".hpckit-launch-", dir=_payload_dir(steps, experiment,
                                                                          settings))
    try:
        _write_payload(payload, job)
        failures = launches = 0
        while True:
            launch = steps.launch()
            log.debug("starting %d ranks: %s", steps.ranks, " ".join(launch.command))
            try:
                code = _run(launch, payload, launches, settings, steps)
            except KeyboardInterrupt as exc:
                _interrupted(experiment, exc, not job.timestamped)
            launches += 1
            if code == exits.OK:
                return result_read(experiment, _returned(payload))
            if not exits.restarts_after(code):
                _ended_on_purpose(code, payload, experiment, job)
            if steps.growing:  # given up on to grow: no failure, as Ray's resize
                end_abandoned_attempt(experiment, f"stopped to grow to {steps.next_ranks()} "
                                      "rank(s)", AttemptStatus.STOPPED)
                continue
            failure = _recorded_failure(payload, code, steps, experiment)
            following = after_failure(steps, policy, failures, causes(failure))
            if following is Next.NO_SPARE:
                _no_spare(steps.no_spare(experiment.display, named), settings, failure)
            if following is Next.SPENT:
                log.error("%s", job.resume_hint(settings))
                end_recorded(experiment, *job.trackers(experiment.parent), AttemptStatus.FAILED)
                raise failure
            failures += 1
            _check_resizable(experiment, steps, job, settings, failure)
            log.warning("the ranks failed; restarting from the last committed checkpoint "
                        "(%s%s):\n%s", policy.describe(failures), _on(steps), failure)
    finally:
        shutil.rmtree(payload, ignore_errors=True)


def _recorded_failure(payload: str, code: int, steps: Steps,
                      experiment: Location) -> BaseException:
    """The ranks' failure, recorded as their attempt's end; raised at once where it is not
    the training's (hpckit's own refusal, which a restart would meet again)."""
    failure = _failure(payload, code, steps)
    if isinstance(failure, HpckitError) and not isinstance(failure, TrainingFailedError):
        raise failure
    end_abandoned_attempt(experiment, str(failure).split("\n", 1)[0],
                          AttemptStatus.HUNG if code == exits.HUNG else AttemptStatus.FAILED)
    return failure


def _ended_on_purpose(code: int, payload: str, experiment: Location, job: TrainingJob) -> None:
    """The ranks stopped, were interrupted or terminated, or lost the experiment to another
    run: never retried."""
    if code == exits.STOPPED:
        _stopped(payload)
    if code == exits.INTERRUPTED:  # the ranks alone were interrupted
        _interrupted(experiment, KeyboardInterrupt(), not job.timestamped)
    if code == exits.TERMINATED:  # killed after a second SIGTERM
        _terminated(experiment)
    if code == exits.TAKEN:  # another run owns the experiment
        _taken(payload)


def _on(steps: Steps) -> str:
    """Where an elastic run's next attempt has another number of ranks, how many."""
    ranks = steps.next_ranks()
    return f", on {ranks} rank(s) instead of {steps.ranks}" if ranks != steps.ranks else ""


def _check_resizable(experiment: Location, steps: Steps, job: TrainingJob, settings: Settings,
                     failure: BaseException) -> None:
    """Before an elastic run starts again on another number of ranks after a failure: its
    last committed checkpoint can be loaded by them, or the run ends (requeued where the job
    allows it) with one line that says why."""
    refused = elastic.refusal(experiment, job.validation_ranks, steps.next_ranks())
    if refused:
        _no_spare(refused, settings, failure)


def _interrupted(experiment: Location, exc: KeyboardInterrupt, rerun_resumes: bool) -> NoReturn:
    """After Ctrl-C: the ranks' attempt recorded interrupted (if they could not), one line
    saying what is kept and how to resume, and the interrupt raised on to the program."""
    stop.exit_on_next_interrupt()
    end_abandoned_attempt(experiment, "interrupted by SIGINT (Ctrl-C)", AttemptStatus.INTERRUPTED)
    try:
        manifest = read_manifest(experiment)
    except HpckitError:
        manifest = None
    latest = manifest.latest.directory if manifest and manifest.latest else None
    log.warning("%s", stop.interrupted_line(experiment, latest, rerun_resumes))
    stop.interrupt_handled()
    raise uncaught.shown_elsewhere(exc)


def _write_payload(payload: str, job: TrainingJob) -> None:
    write_payload(payload, job, "job.pkl", "the trainer", f"define "
                  f"{job.train_loop.__qualname__} at module level (not a lambda or a nested "
                  "function) and keep train_loop_config picklable")


def _payload_dir(steps: Steps, experiment: Location, settings: Settings) -> str | None:
    """Where the ranks find the job: on this node, or, for ranks on several nodes, beside the
    experiment where it is on a shared filesystem, else in the working directory."""
    if steps.allocation is None:
        return settings.local_dir
    return experiment.parent.path if experiment.is_local else os.getcwd()


def _no_spare(said: str, settings: Settings, failure: BaseException) -> NoReturn:
    """No node is left to replace a lost one: the job requeued where it allows it, else the
    run ends."""
    if requeued_instead(said, settings):
        raise SystemExit(exits.STOPPED) from None
    raise uncaught.shown_elsewhere(NoSpareNode(said)) from failure


def _run(launch: Launch, payload: str, attempt: int, settings: Settings, steps: Steps) -> int:
    for folder in (ERRORS, heartbeat.FOLDER):
        shutil.rmtree(os.path.join(payload, folder), ignore_errors=True)
        os.makedirs(os.path.join(payload, folder))
    code = run_process(launch, {variable("worker"): payload, variable("attempt"): str(attempt),
                                variable("heartbeat"): os.path.join(payload, heartbeat.FOLDER),
                                variable("run_id"): os.path.basename(payload),
                                variable("started_at"): started_for(attempt, settings)},
                       settings, abandon=steps.watch(os.path.join(payload, heartbeat.FOLDER)))
    if code == exits.ABANDONED:
        steps.cancel()
    return code


def _failure(payload: str, code: int, steps: Steps) -> BaseException:
    """The exception that fit() raises for the ranks' failure."""
    reports = read_errors(payload)
    if code == exits.HUNG:
        return WorkerGroupError(HUNG, {})
    if code == exits.ABANDONED:
        return WorkerGroupError(
            f"node(s) {','.join(sorted(steps.lost))} of the run were lost, with their ranks; "
            "the job step that waited for them was cancelled.", {})
    if not reports:
        return WorkerGroupError(
            f"{steps.launcher} exited with status {code} and no rank reported an exception: a "
            "rank was probably killed (by a signal, or the out-of-memory killer); see the "
            "output above.", {})
    first = reports[0]
    if not first.training:
        original = first.failure.original()
        if isinstance(original, BaseException):
            return original
    failures = {r.failure.rank: _cause(r.failure.rank, r.failure.original())
                or TrainingFailedError(r.failure.error) for r in reports}
    return WorkerGroupError(describe([r.failure for r in reports], "training"), failures)


def _terminated(experiment: Location) -> NoReturn:
    """SIGTERM ended the ranks. Where they had requeued the job first (Slurm ends a requeued
    job's steps and its batch process, this one, with SIGTERM) that is a stop, already told."""
    if _last_attempt_status(experiment) == AttemptStatus.REQUEUED:
        raise SystemExit(exits.STOPPED)
    end_abandoned_attempt(experiment, "killed after a second SIGTERM, before its next report",
                          AttemptStatus.INTERRUPTED)
    log.warning("the ranks were killed after a second SIGTERM. To continue from the last "
                "committed checkpoint: hpckit resume %s", experiment.display)
    raise SystemExit(exits.TERMINATED)


def _last_attempt_status(experiment: Location) -> AttemptStatus | None:
    try:
        manifest = read_manifest(experiment)
    except HpckitError:
        return None
    return manifest.attempts[-1].status if manifest and manifest.attempts else None


def _stopped(payload: str) -> NoReturn:
    """The ranks stopped on request: requeued (exit 75), or not (rank 0's PreemptionError,
    already told in the log, raised here as in Ray)."""
    for report in read_errors(payload):
        original = report.failure.original()
        if isinstance(original, PreemptionError):
            raise uncaught.shown_elsewhere(original)
    raise SystemExit(exits.STOPPED)


def _taken(payload: str) -> NoReturn:
    """Another run took the experiment over: the ranks' ExperimentTakenError, raised here as
    it is. Nothing is recorded: the manifest is that run's now."""
    for report in read_errors(payload):
        original = report.failure.original()
        if isinstance(original, ExperimentTakenError):
            raise original
    raise SystemExit(exits.TAKEN)


def _returned(payload: str) -> Any:
    """What the training function returned on rank 0 (None if it could not be kept)."""
    path = os.path.join(payload, RETURNED)
    if not os.path.exists(path):
        return None
    # The ranks ran the script as __mp_main__ (as multiprocessing does): here it is __main__.
    sys.modules.setdefault("__mp_main__", sys.modules["__main__"])
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, AttributeError, ImportError) as exc:
        log.warning("rank 0's return value could not be read back (%s); Result.return_value "
                    "is None", exc)
        return None


def _cause(rank: int, raised: BaseException | None) -> BaseException | None:
    """What the training function raised on ``rank``, out of the error that rank raised."""
    if isinstance(raised, WorkerGroupError):
        return raised.worker_failures.get(rank, raised)
    return raised
