"""Running a job on the ranks of this MPI world: the world is checked, the experiment name
agreed, and attempts run until one succeeds or the retry policy gives up."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from hpckit import exits, logs
from hpckit.config.scaling import ScalingConfig
from hpckit.errors import AttemptFailed, ExperimentTakenError, LaunchError, PreemptionError
from hpckit.logs import log
from hpckit.result import Result
from hpckit.run.attempt import Ranks, run_attempt
from hpckit.run.ending import exit as rank_exit
from hpckit.run.ending import stop
from hpckit.run.ending.exit import finalize_with_hydra
from hpckit.run.ending.retry import RetryPolicy, recurring
from hpckit.run.job import TrainingJob
from hpckit.run.mpi import library, progress
from hpckit.run.mpi.comm import RankFailure, duplicate, failed_ranks, raised_together, world
from hpckit.run.mpi.group import discover
from hpckit.run.mpi.waiting import from_root, wait_for_all
from hpckit.run.startup import shm
from hpckit.run.startup.watchdog import StartupWatchdog, start_heartbeat
from hpckit.run.validation import pool
from hpckit.settings import Settings

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


def run_ranks(job: TrainingJob, settings: Settings, trial: Comm | None = None) -> Result:
    """Run ``job`` on every rank of this process's MPI world, or of ``trial`` (a communicator
    of some of its ranks: a sweep's trial); returns its :class:`Result`."""
    # Before anything slow: a stop signal during start-up must not kill the rank.
    with stop.handling(settings.stop_signal):
        try:
            return _run(job, settings, trial)
        except KeyboardInterrupt as exc:  # never retried: the user asked the run to stop
            rank_exit.interrupted(exc)


def start_mpi(settings: Settings) -> None:
    """Start MPI on a rank that hpckit started, before it imports the user's script.

    The ranks of a job start together, so they come to MPI_Init together; after the script's
    imports (torch: seconds, more on a loaded node) they would come seconds apart, and MPICH's
    start-up busy-polls in shared memory until the last one comes, taking the CPU from it.
    Waiting for the script's imports is left to :func:`~hpckit.run.mpi.comm.duplicate`,
    which sleeps."""
    _prepare(settings)
    with StartupWatchdog(settings):
        world()


def _prepare(settings: Settings) -> None:
    """What must come before MPI_Init (again harmless): this rank's PID for its launcher,
    the shared memory a killed run left, the node's heartbeat."""
    rank = settings.launched_rank
    logs.configure(int(rank) if rank.isdigit() else 0)
    rank_exit.register_pid(settings)
    shm.clear_stale_segments(settings)
    start_heartbeat(settings)  # where the launcher watches this rank's node (hpckit run)


def _run(job: TrainingJob, settings: Settings, trial: Comm | None) -> Result:
    _prepare(settings)
    with contextlib.ExitStack() as stack:
        with StartupWatchdog(settings):
            launched = duplicate(trial or world())
            rank_exit.register_pid(settings, shm.mapped_segments())
            rank_exit.prepare_interrupts(launched)
            configure_logs(launched.rank, job, settings)
            try:  # hpckit resume -n N sets the world it checked: ScalingConfig follows
                check_world(launched.size, job.resumed(settings)[0].scaling_config,
                            job.validation_ranks, settings if trial is None else None)
                pool.check_threads(job.validation_ranks)
            except LaunchError as exc:
                rank_exit.fail(launched, settings, exc, collective=True, training=False)
            part = pool.split_off(launched, launched.size - job.validation_ranks,
                                  job.validation_config)
            if isinstance(part, pool.Training):  # from here, how the run ends reaches the others
                ended = stack.enter_context(pool.ending(part.pool, part.comm.rank))
                job, ranks = _agree(job, settings, part.comm, part.pool)
        if isinstance(part, pool.Validating):
            with stop.terminations(settings.stop_signal):  # a stop comes from rank 0, not SIGTERM
                returned: Result = pool.serve(part, settings.local_dir)
            return returned
        try:
            ended.result = result = _attempts(job, settings, trial, ranks, ended)
        except BaseException:
            if launched.size == 1:  # a failed fit() in this process, which may call another
                _free(ranks, launched)
            raise
        _free(ranks, launched)  # every training rank is here: the run ended well
        return result


def _free(ranks: Ranks, launched: Comm) -> None:
    """The communicators this fit() made (MPI has a few thousand in a process)."""
    ranks.group.free()
    progress.free(launched)


def _agree(job: TrainingJob, settings: Settings, comm: Comm,
           validation: pool.Pool | None) -> tuple[TrainingJob, Ranks]:
    """The training ranks: where each runs, and the experiment's name."""
    job, redirected = job.resumed(settings)
    if redirected and comm.rank == 0:
        log.warning("%s", redirected)
    group = discover(comm, settings.ranks_per_node or None)
    name = from_root(comm, job.named(settings).name if comm.rank == 0 else None)
    return job.named(settings, name), Ranks(group, validation)


def _attempts(job: TrainingJob, settings: Settings, trial: Comm | None, ranks: Ranks,
              ended: pool.Ending) -> Result:
    """Attempts until one succeeds or the retry policy gives up."""
    comm = ranks.group.world
    policy = RetryPolicy(job.run_config.failure_config.max_failures)
    number = settings.attempt
    while True:
        try:
            with stop.terminations(settings.stop_signal):
                return run_attempt(job, ranks, settings, number)
        except SystemExit as exc:
            if exc.code == exits.STOPPED and trial is None:  # requeued; a sweep's: its own
                ended.end(exc)  # the ranks set aside exit 75 with the others
                rank_exit.requeued(comm)
            raise
        except KeyboardInterrupt:
            raise
        except PreemptionError as stopped:  # every rank, together: the run stopped, not failed
            if settings.worker and comm.rank == 0:  # for fit() in the process that started us
                rank_exit.write_error(settings.worker, rank_exit.ErrorReport(
                    RankFailure.capture(0, stopped), training=False))
            ended.end(stopped)  # the ranks set aside exit 75 with the others
            wait_for_all(comm, together=True)  # then each exits 75 at once (uncaught)
            finalize_with_hydra()  # so that mpiexec kills no rank still on its way out
            raise
        except AttemptFailed as failure:
            if failure.collective and isinstance(failure.cause, ExperimentTakenError):
                ended.end(failure.cause)  # the ranks set aside exit with the others
                rank_exit.taken(comm, settings, failure.cause)
            # A single rank that hpckit did not launch restarts itself, and so do a sweep's
            # trial's ranks that failed together; launched ranks are restarted by whoever
            # launched them (hpckit's parent process, or the user).
            alone = comm.size == 1
            here = (alone and settings.launcher is None) or (
                trial is not None and (alone or failure.collective))
            causes = list(failed_ranks(failure.cause).values()) or [failure.cause]
            if not (here and policy.allows(number, causes)):
                if here and (why := recurring(causes)) and comm.rank == 0:
                    log.error("%s", why)
                rank_exit.fail(comm, settings, failure.cause, failure.collective, training=True,
                               resume=job.resume_hint(settings))
            number += 1
            log.warning("attempt %d failed (%s); restarting from the last committed "
                        "checkpoint (%s)", number - 1, failure.cause, policy.describe(number))
        except BaseException as exc:
            rank_exit.fail(comm, settings, exc, raised_together(exc), training=False)


def check_world(size: int, scaling: ScalingConfig, validating: int,
                settings: Settings | None) -> None:
    """The world agrees with the launcher (``settings``; None: a trial's ranks) and with
    ``num_workers`` (an elastic run's range) and the ranks ``validating`` beside them."""
    tasks, launcher = (settings.launched_tasks, settings.launcher) if settings else (None, None)
    if tasks is not None and tasks != size:
        version = library.loaded_version()
        raise LaunchError(
            f"the launcher ({launcher}) started {tasks} tasks but MPI sees a world of "
            f"{size}: the launcher and mpi4py's MPI ({version}) disagree. With srun use "
            f"--mpi={library.srun_plugin(version)}; with mpirun use the mpiexec of the MPI "
            "that mpi4py loads (hpckit doctor compares them).")
    low, high = scaling.min_workers + validating, scaling.max_workers + validating
    if not low <= size <= high:
        beside = f" and ValidationConfig(ranks={validating})" if validating else ""
        launched = high if size > high else low
        raise LaunchError(
            f"ScalingConfig(num_workers={scaling.num_workers!r}){beside} but {size} rank(s) "
            f"were launched; make them agree (mpirun -n {launched} ..., srun "
            f"--ntasks={launched}) or set num_workers={size - validating}.")


def configure_logs(rank: int, job: TrainingJob, settings: Settings) -> None:
    """The run's LoggingConfig; HPCKIT_LOG_LEVEL, where set, wins over its level."""
    config = job.run_config.logging_config
    if config is None:
        logs.configure(rank)
    else:
        logs.configure(rank, None if settings.log_level else config.log_level, config.encoding)
