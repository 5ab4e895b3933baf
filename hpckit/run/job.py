"""The training job every rank runs: the training function, its configs, and the framework
back-end that is set up before it. A value, pickled as it is to the ranks hpckit starts
(``write_payload``: what a process that re-runs the user's script needs)."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow.fs

from hpckit.checkpoint import Checkpoint
from hpckit.config import RunConfig, ScalingConfig, ValidationConfig
from hpckit.config.callbacks import TrackedExperiment, TrackerCallback
from hpckit.errors import LaunchError, ProtocolError
from hpckit.experiment.attempts import AttemptStatus
from hpckit.experiment.manifest import SWEEP_NAME, Manifest
from hpckit.experiment.reading import read_manifest
from hpckit.experiment.values import jsonable
from hpckit.logs import log
from hpckit.run.ending.exit import ERRORS, resume_hint
from hpckit.run.mpi.group import Group
from hpckit.settings import Settings
from hpckit.storage import files
from hpckit.storage.location import Location, resolve
from hpckit.storage.uris import redact

DEFAULT_STORAGE = "~/hpckit_results"
# $HPCKIT_RESUME under ``hpckit resume SWEEP``: the sweep continues $HPCKIT_NAME at
# $HPCKIT_STORAGE whatever its RunConfig names; no training function is redirected.
RESUMED_SWEEP = "<sweep>"
TIMESTAMP = "%Y%m%d-%H%M%S"  # default_name's, outside Slurm
TIMESTAMPED = r"-\d{8}-\d{6}"


class Backend:
    """Framework set-up on every rank before the training function runs: none here.
    :class:`hpckit.torch.TorchTrainer`'s back-end joins a torch.distributed process group."""

    def setup(self, group: Group, scaling: ScalingConfig, settings: Settings) -> None:
        """Prepare this rank; every rank calls it at the same point."""

    def keepers(self) -> dict[str, Any]:
        """The random streams each checkpoint keeps for an exact resume, by name, as keepers
        (``run.session.resumable``): none without a framework."""
        return {}


@dataclass(frozen=True)
class TrainingJob:
    train_loop: Callable[..., Any]
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    run_config: RunConfig
    resume_from_checkpoint: Checkpoint | None
    backend: Backend
    validation_config: ValidationConfig | None = None
    timestamped: bool = False
    """The name is default_name's timestamp: running the same command again starts another
    experiment instead of resuming this one."""

    @property
    def validation_ranks(self) -> int:
        """Launched ranks that validate instead of training (``ValidationConfig.ranks``)."""
        return self.validation_config.ranks if self.validation_config is not None else 0

    @property
    def launched_ranks(self) -> int:
        return self.scaling_config.max_workers + self.validation_ranks

    def trackers(self, root: Location) -> tuple[tuple[TrackerCallback, ...], TrackedExperiment]:
        """``RunConfig(callbacks=...)``'s experiment trackers, and what they are told of this
        experiment (under ``root``)."""
        trackers = tuple(c for c in self.run_config.callbacks or ()
                         if isinstance(c, TrackerCallback))
        trial = bool(trackers) and files.file_type(root.join(SWEEP_NAME)) == pyarrow.fs.FileType.File
        return trackers, TrackedExperiment(self.name, root.join(self.name).display,
                                           dict(self.train_loop_config or {}),
                                           self.name if trial else None, root.name if trial else None)

    def storage_root(self, settings: Settings) -> Location:
        path = self.run_config.storage_path or settings.storage or DEFAULT_STORAGE
        return resolve(path, self.run_config.storage_filesystem)

    def named(self, settings: Settings, name: str | None = None) -> TrainingJob:
        """This job with its experiment name fixed, so every rank and attempt agree."""
        if self.run_config.name:
            return self
        return replace(self, run_config=replace(self.run_config, name=name or default_name(settings)),
                       timestamped=_slurm_suffix(settings) is None and not settings.name)

    def resumed(self, settings: Settings) -> tuple[TrainingJob, str | None]:
        """Under ``hpckit resume EXP``: this job continuing EXP whatever its RunConfig names
        (and with ``-n N``, on N ranks whatever its ScalingConfig says), and a line to log
        when that named another experiment. Only the job of the training
        function that EXP records ($HPCKIT_RESUME; ``*``: any) is redirected, so a script
        with several trainers runs the others as it would anyway."""
        if not (settings.resume and settings.name and settings.storage):
            return self, None
        if settings.resume not in ("*", _qualified_name(self.train_loop)):
            return self, None
        named = self.named(settings)
        before = named.storage_root(settings).join(named.name)
        config = replace(self.run_config, name=settings.name, storage_path=settings.storage)
        job = replace(self, run_config=config)
        if settings.resume_workers:  # hpckit resume -n N: the world it was checked for
            job = replace(job, scaling_config=self.scaling_config.resized(settings.resume_workers))
        after = job.storage_root(settings).join(settings.name)
        if before.display == after.display:
            return job, None
        return job, (f"hpckit resume continues {after.display}, not {before.display} that the "
                     "script's RunConfig(name=..., storage_path=...) names")

    @property
    def name(self) -> str:
        if self.run_config.name is None:
            raise ProtocolError("a training job was run before it was named (TrainingJob.named)")
        return self.run_config.name

    def resume_hint(self, settings: Settings) -> str:
        """How to continue this job's experiment after a failure that ends the run."""
        return resume_hint(self.storage_root(settings).join(self.name).display,
                           not self.timestamped)

    def warn_if_meant_to_resume(self, root: Location, manifest: Manifest) -> None:
        """On rank 0, once the experiment is open: see :func:`meant_to_resume`."""
        if not self.timestamped or len(manifest.attempts) != 1:
            return
        try:
            warning = meant_to_resume(root, self.name)
        except Exception as exc:  # noqa: BLE001  (a hint: never a reason for the run to fail)
            log.debug("could not look for an earlier experiment to resume: %s", exc)
            return
        if warning:
            log.warning("%s", warning)

    def call_train_loop(self) -> Any:
        if inspect.signature(self.train_loop).parameters:
            return self.train_loop(self.train_loop_config or {})
        return self.train_loop()

    def config_record(self, root: Location) -> dict[str, Any]:
        """The run's configuration as the manifest records it (secrets redacted)."""
        seed = self.resume_from_checkpoint
        return {
            "train_loop": _qualified_name(self.train_loop),
            "train_loop_config": jsonable(self.train_loop_config or {}),
            "scaling_config": jsonable(asdict(self.scaling_config)),
            "validation_ranks": self.validation_ranks,  # launched beside the world
            "storage_path": root.display,
            "failure_config": asdict(self.run_config.failure_config),
            "resume_from_checkpoint": seed.uri if seed else None,
        }


def command_record(settings: Settings) -> dict[str, Any]:
    """How this run was started, for ``hpckit resume``."""
    return {"argv": [redact(a) for a in sys.argv], "executable": sys.executable, "cwd": os.getcwd(),
            "launcher": settings.launcher or "python"}


def default_name(settings: Settings) -> str:
    """$HPCKIT_NAME, else the script's name plus the Slurm job (so a requeued job resumes),
    else a timestamp."""
    if settings.name:
        return settings.name
    stem = os.path.splitext(os.path.basename(sys.argv[0] or ""))[0] or "hpckit"
    return f"{stem}-{_slurm_suffix(settings) or time.strftime(TIMESTAMP)}"


def meant_to_resume(root: Location, name: str) -> str | None:
    """For a new experiment ``name`` that default_name made from the time: a warning when the
    same script's experiment just before it did not finish and has a checkpoint, since the
    person who ran the command again most likely meant to resume that one."""
    stem = re.sub(TIMESTAMPED + "$", "", name)
    pattern = re.compile(re.escape(stem) + TIMESTAMPED)
    earlier = [i.base_name for i in files.list_dir(root) if i.type == pyarrow.fs.FileType.Directory
               and pattern.fullmatch(i.base_name) and i.base_name < name]
    if not earlier:
        return None
    previous = root.join(max(earlier))
    manifest = read_manifest(previous)
    last = manifest.last_attempt if manifest else None
    if manifest is None or last is None or manifest.latest is None or last.status in (
            AttemptStatus.FINISHED, AttemptStatus.RUNNING):
        return None
    return (f"this run starts a new experiment, {name}: with no RunConfig(name=...) its name is "
            f"made from the time, so it does not resume {previous.display}, the same script's "
            f"last experiment ({last.status.value}, with {manifest.latest.directory} committed). "
            f"To continue that one instead: hpckit resume {previous.display}, or run the "
            f"script with RunConfig(name={previous.name!r}).")


def _slurm_suffix(settings: Settings) -> str | None:
    if settings.slurm_array_job_id and settings.slurm_array_task_id:
        return f"job{settings.slurm_array_job_id}_{settings.slurm_array_task_id}"
    return f"job{settings.slurm_job_id}" if settings.slurm_job_id else None


def _qualified_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    return f"{'__main__' if module == '__mp_main__' else module}.{getattr(fn, '__qualname__', fn)}"


def write_payload(payload: str, what: Any, name: str, subject: str, fix: str) -> None:
    """What ranks that re-run the user's script need: ``what`` (``subject`` to a person)
    pickled as ``name``, and how to import the script (``main.json``). ``fix`` says what to
    change when it cannot be pickled."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if not path:
        raise LaunchError(
            f"{subject} runs in processes that hpckit starts by re-running your script file, "
            "and this is an interactive session: put the code in a .py file and run it (or "
            "launch it with mpiexec -n N python script.py).")
    try:
        data = pickle.dumps(what)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise LaunchError(f"{subject} cannot be sent to the ranks ({exc}); {fix}.") from None
    with open(os.path.join(payload, name), "wb") as f:
        f.write(data)
    spec = {"main": os.path.abspath(path), "argv": sys.argv, "sys_path": sys.path,
            "cwd": os.getcwd()}
    with open(os.path.join(payload, "main.json"), "w") as f:
        json.dump(spec, f)
    os.makedirs(os.path.join(payload, ERRORS))
