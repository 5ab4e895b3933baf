"""The trainers: fit() runs the training function on every rank of an MPI world."""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

from hpckit import (
    _artifacts,
    _comm,
    _distributed,
    _experiment,
    _launch,
    _lock,
    _log,
    _mirror,
    _retention,
    _slurm,
    _stop,
    _storage,
    _verify,
)
from hpckit._commit import finish
from hpckit._env import Environment
from hpckit._log import log
from hpckit._manifest import Manifest
from hpckit._session import Session, activate
from hpckit._uri import Location, redact, resolve
from hpckit.checkpoint import Checkpoint
from hpckit.config import RunConfig, ScalingConfig
from hpckit.context import TrainContext
from hpckit.errors import ConfigError, LaunchError, StorageError
from hpckit.result import Result

DEFAULT_STORAGE = "~/hpckit_results"
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)


class DataParallelTrainer:
    """Run a training function on every rank of an MPI job, with hpckit's checkpoints,
    metrics, retention and resume, and no deep-learning framework set up (as in Ray Train).

    Use it for NumPy, JAX or scikit-learn jobs that coordinate through mpi4py themselves;
    :class:`hpckit.torch.TorchTrainer` adds the torch.distributed process group and devices.
    ``fit()`` works the same under ``mpirun``/``srun`` (the launched processes are the ranks)
    and from ``python train.py`` (hpckit starts ``num_workers`` ranks on this node itself).
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: dict[str, Any] | None = None,
                 scaling_config: ScalingConfig | None = None,
                 run_config: RunConfig | None = None,
                 resume_from_checkpoint: Checkpoint | None = None) -> None:
        if not callable(train_loop_per_worker):
            raise ConfigError(f"{type(self).__name__}(train_loop_per_worker={train_loop_per_worker!r}) "
                              "must be a function taking the config dict (or nothing).")
        if len(inspect.signature(train_loop_per_worker).parameters) > 1:
            raise ConfigError(f"train_loop_per_worker {train_loop_per_worker.__name__}() must take "
                              "one argument (train_loop_config) or none.")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError(f"{type(self).__name__}(train_loop_config={train_loop_config!r}) must be "
                              "a dict.")
        for name, value, kind in (("scaling_config", scaling_config, ScalingConfig),
                                  ("run_config", run_config, RunConfig),
                                  ("resume_from_checkpoint", resume_from_checkpoint, Checkpoint)):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"{type(self).__name__}({name}={value!r}) must be a {kind.__name__}.")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from_checkpoint = resume_from_checkpoint

    def fit(self) -> Result:
        """Train on every rank; return the :class:`Result` (on every rank under a launcher)."""
        if _launch.importing_main:
            raise _launch.MainImported()
        env = Environment.read()
        if env.launcher is None and self.scaling_config.num_workers > 1:
            return _launch.spawn(self, env)
        return self._run_ranks(env)

    # -- helpers shared with the launcher --------------------------------------------------

    def _storage_root(self, env: Environment) -> Location:
        path = self.run_config.storage_path or env.storage or DEFAULT_STORAGE
        return resolve(path, self.run_config.storage_filesystem)

    def _named(self, env: Environment, name: str | None = None) -> DataParallelTrainer:
        """This trainer with its experiment name fixed, so every rank and attempt agree."""
        if self.run_config.name:
            return self
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.run_config = replace(self.run_config, name=name or default_name(env))
        return clone

    # -- the ranks ----------------------------------------------------------------------

    def _run_ranks(self, env: Environment) -> Result:
        # Before anything slow: a stop signal during start-up must not kill the rank.
        with _stop.handling(env.stop_signal):
            return self._run_ranks_handling_stops(env)

    def _run_ranks_handling_stops(self, env: Environment) -> Result:
        comm = _comm.world().Dup()
        _log.configure(comm.rank, env)
        _launch.register_pid(env)
        try:
            _check_world(comm.size, self.scaling_config.num_workers, env)
        except LaunchError as exc:
            _launch.fail(comm, env, exc, collective=True, training=False)
        topology, local_comm = _comm.discover(comm)
        name = comm.bcast(self._named(env).run_config.name if comm.rank == 0 else None, root=0)
        trainer = self._named(env, name)
        attempt = int(env.attempt or 0)
        while True:
            try:
                return trainer._attempt(comm, local_comm, topology, env, attempt)
            except SystemExit:
                raise
            except _TrainingError as failure:
                if not _retry_in_process(trainer, env, comm.size, attempt):
                    _launch.fail(comm, env, failure.cause, failure.collective, training=True)
                log.warning("attempt %d failed (%s); restarting from the last committed "
                            "checkpoint", attempt, failure.cause)
                attempt += 1
            except BaseException as exc:
                _launch.fail(comm, env, exc, getattr(exc, "_hpckit_collective", False),
                             training=False)

    def _attempt(self, comm: Any, local_comm: Any, topology: _comm.Topology, env: Environment,
                 attempt: int) -> Result:
        root = self._storage_root(env)
        name = self.run_config.name
        assert name is not None
        experiment = root.join(name)
        opened: dict[str, Any] = {}

        def open_experiment() -> _Start:
            opened["manifest"], opened["metrics"], opened["lock"], start = self._open_experiment(
                root, name, comm.size, env, attempt)
            return start

        start = _comm.on_root(comm, open_experiment, f"opening experiment {experiment.display}",
                              StorageError)
        lock: _lock.Lock | None = opened.get("lock")
        mirror: _mirror.Mirror | None = None
        try:
            manifest, metrics = opened.get("manifest"), opened.get("metrics")
            _comm.everywhere(comm, lambda: _check_visible(experiment, start.marker, topology),
                             "checking that every rank sees the storage", StorageError)
            if comm.rank == 0:
                _storage.delete_file(experiment.join(start.marker))
            started = time.perf_counter()
            self._setup_backend(comm, local_comm, topology, env)
            sync = self.run_config.sync_config
            artifacts = _artifacts.Artifacts(
                experiment, comm.rank, env.local_dir,
                sync.sync_artifacts and (comm.rank == 0 or sync.sync_artifacts_all_ranks))
            context = TrainContext(topology, name, experiment, attempt, env.launcher, env.slurm(),
                                   _artifacts=artifacts)
            session = Session(comm, context, self.run_config.checkpoint_config, start.next_step,
                              Checkpoint._at(experiment.join(start.latest)) if start.latest else None,
                              self.resume_from_checkpoint, manifest, metrics)
            if sync.mirror is not None and comm.rank == 0:
                session.mirror = mirror = _mirror.Mirror(experiment, name, sync,
                                                         lambda: session.manifest)
            log.info("%d rank(s) on %d node(s) ready in %.2f s; experiment %s", topology.world_size,
                     topology.num_nodes, time.perf_counter() - started, experiment.display)
            activate(session)
            try:
                self._call_train_loop()
                finish(session)
            except _stop.StopRequested as stop:
                _stop_run(session, env, str(stop))
            except BaseException as exc:
                if comm.rank == 0:
                    _close_attempt(session, "failed", f"{type(exc).__name__}: {exc}")
                raise _TrainingError(exc, getattr(exc, "_hpckit_collective", False)) from exc
            finally:
                activate(None)
                artifacts.close()
                if session.metrics is not None:
                    session.metrics.close()
            summary = None
            if comm.rank == 0:
                _close_attempt(session, "finished", None)
                final, log_ = session.coordinator_state()
                summary = (final.to_json(), [json.loads(line) for line in log_.lines])
            manifest_json, history = comm.bcast(summary, root=0)
            return Result._build(experiment, Manifest.from_json(manifest_json, experiment.display), history)
        finally:
            if mirror is not None:
                mirror.close()
            if lock is not None:
                lock.release()

    def _setup_backend(self, comm: Any, local_comm: Any, topology: _comm.Topology,
                       env: Environment) -> None:
        """Framework set-up on every rank before the training function runs; none here."""

    def _call_train_loop(self) -> None:
        if inspect.signature(self.train_loop_per_worker).parameters:
            self.train_loop_per_worker(self.train_loop_config or {})
        else:
            self.train_loop_per_worker()

    def _open_experiment(self, root: Location, name: str, world_size: int, env: Environment,
                         attempt: int) -> tuple[Manifest, _experiment.MetricsLog, _lock.Lock, _Start]:
        """Rank 0: lock the experiment, create or resume it, and record this attempt."""
        experiment = _experiment.prepare(root, name)
        lock = _lock.Lock.acquire(experiment, env)
        try:
            manifest = _experiment.read_manifest(experiment)  # read once the lock is ours
            manifest, metrics, start = self._begin(experiment, manifest, name, world_size, env, attempt)
            return manifest, metrics, lock, start
        except BaseException:
            lock.release()
            raise

    def _begin(self, experiment: Location, manifest: Manifest | None, name: str, world_size: int,
               env: Environment, attempt: int) -> tuple[Manifest, _experiment.MetricsLog, _Start]:
        if manifest is None:
            manifest = Manifest(name, world_size, _command(env), self._config_record(experiment.parent),
                                _retention.record(self.run_config.checkpoint_config), time.time())
        else:
            _verify.drop_escaping(experiment, manifest)
            if self.run_config.checkpoint_config.verify_on_resume:
                _verify.drop_damaged(experiment, manifest)
            _experiment.remove_leftovers(experiment, manifest)
            latest = manifest.latest
            manifest.next_step = latest.step + 1 if latest else 0
            manifest.retention = _retention.record(self.run_config.checkpoint_config)
            if manifest.world_size != world_size:
                log.warning("resuming %s with %d ranks; it was recorded with %d", name, world_size,
                            manifest.world_size)
                manifest.world_size = world_size
            log.info("resuming experiment %s from %s", experiment.display,
                     latest.directory if latest else "its start (no checkpoint was committed)")
        for earlier in manifest.attempts:
            if earlier.get("status") == "running":
                earlier["status"] = "interrupted"
        manifest.attempts.append({
            "attempt": attempt, "started_at": time.time(), "status": "running",
            "world_size": world_size, "launcher": env.launcher or "python",
            "host": socket.gethostname(), "pid": os.getpid(), "argv": [redact(a) for a in sys.argv],
            "slurm": env.slurm()})
        _experiment.write_manifest(experiment, manifest)
        metrics = _experiment.MetricsLog.resume(experiment, manifest.next_step, manifest.latest)
        marker = f".hpckit-visible-{uuid.uuid4().hex}"
        _storage.write_bytes(experiment.join(marker), b"")
        latest = manifest.latest
        return manifest, metrics, _Start(latest.directory if latest else None, manifest.next_step, marker)

    def _config_record(self, root: Location) -> dict[str, Any]:
        run = self.run_config
        return {
            "train_loop": _qualified_name(self.train_loop_per_worker),
            "train_loop_config": _jsonable(self.train_loop_config or {}),
            "scaling_config": _jsonable(asdict(self.scaling_config)),
            "storage_path": root.display,
            "failure_config": asdict(run.failure_config),
            "resume_from_checkpoint": (self.resume_from_checkpoint.uri
                                       if self.resume_from_checkpoint else None),
        }


class TorchTrainer(DataParallelTrainer):
    """Data-parallel PyTorch training on the ranks of an MPI job: every rank joins one
    torch.distributed process group (NCCL on GPUs with ``use_gpu``, Gloo on CPUs) and gets
    its device before the training function runs."""

    def _setup_backend(self, comm: Any, local_comm: Any, topology: _comm.Topology,
                       env: Environment) -> None:
        _distributed.setup(comm, local_comm, topology, self.scaling_config, env, PROCESS_GROUP_TIMEOUT)


@dataclass(frozen=True)
class _Start:
    latest: str | None
    next_step: int
    marker: str


class _TrainingError(Exception):
    def __init__(self, cause: BaseException, collective: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.collective = collective


def _stop_run(session: Session, env: Environment, signal_name: str) -> None:
    """After the checkpoint that followed a stop request: requeue under Slurm, then exit."""
    comm = session.comm
    if comm.rank == 0:
        job = _slurm.job_to_requeue(env)
        reason = f"stop requested by {signal_name}"
        _close_attempt(session, "requeued" if job else "stopped", reason)
        if not (job and _slurm.requeue(env)):
            if job:
                _close_attempt(session, "stopped", reason)
            log.warning("stopped after committing %s (%s). To continue, run the same command "
                        "again, or: hpckit resume %s", session.latest.uri if session.latest else "-",
                        reason, session.context.experiment.display)
    _comm.wait_for_all(comm)
    raise SystemExit(_stop.EXIT_STOPPED)


def _retry_in_process(trainer: DataParallelTrainer, env: Environment, world_size: int, attempt: int) -> bool:
    """Only a single rank that hpckit did not launch restarts itself; launched ranks are
    restarted by whoever launched them (hpckit's parent process, or the user)."""
    limit = trainer.run_config.failure_config.max_failures
    return world_size == 1 and env.launcher is None and (limit == -1 or attempt < limit)


def _check_world(size: int, num_workers: int, env: Environment) -> None:
    tasks = env.launched_tasks
    if tasks is not None and tasks != size:
        raise LaunchError(
            f"the launcher ({env.launcher}) started {tasks} tasks but MPI sees a world of {size}: "
            "the launcher and mpi4py's MPI disagree. With srun use --mpi=pmi2; with mpirun use "
            "the mpiexec of the MPI that mpi4py was built with.")
    if size != num_workers:
        raise LaunchError(
            f"ScalingConfig(num_workers={num_workers}) but {size} rank(s) were launched; make "
            f"them agree (mpirun -n {num_workers} ..., srun --ntasks={num_workers}) or set "
            f"num_workers={size}.")


def _check_visible(experiment: Location, marker: str, topology: _comm.Topology) -> None:
    import pyarrow.fs

    if _storage.file_type(experiment.join(marker)) != pyarrow.fs.FileType.File:
        raise StorageError(
            f"rank {topology.world_rank} on {topology.hostname} cannot see {experiment.display} "
            "as rank 0 wrote it: the storage path is not shared by every node (a node-local "
            "path such as /tmp in a multi-node job?). Use a shared filesystem (Lustre, NFS) or S3.")


def _close_attempt(session: Session, status: str, error: str | None) -> None:
    if session.manifest is not None:
        _experiment.end_attempt(session.context.experiment, session.manifest, status, error,
                                reports=session.reports)


def default_name(env: Environment) -> str:
    """$HPCKIT_NAME, else the script's name plus the Slurm job (so a requeued job resumes),
    else a timestamp."""
    if env.name:
        return env.name
    stem = os.path.splitext(os.path.basename(sys.argv[0] or ""))[0] or "hpckit"
    if env.slurm_array_job_id and env.slurm_array_task_id:
        return f"{stem}-job{env.slurm_array_job_id}_{env.slurm_array_task_id}"
    if env.slurm_job_id:
        return f"{stem}-job{env.slurm_job_id}"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _qualified_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{'__main__' if module == '__mp_main__' else module}.{getattr(fn, '__qualname__', fn)}"


def _command(env: Environment) -> dict[str, Any]:
    return {"argv": [redact(a) for a in sys.argv], "executable": sys.executable, "cwd": os.getcwd(),
            "launcher": env.launcher or "python"}


def _jsonable(value: Any) -> Any:
    """The config as JSON for the manifest: secrets in URIs redacted, other objects repr'd."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    return repr(value)


