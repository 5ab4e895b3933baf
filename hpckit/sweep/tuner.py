"""Tuner: Ray Tune's entry point. ``Tuner(trainable, param_space=..., tune_config=...,
run_config=...).fit()`` runs every trial of the search space and returns a ResultGrid.

Running the same script again (or ``Tuner.restore(path, trainable)``) resumes the sweep, as
Ray's ``resume="AUTO"``: finished trials are kept, an interrupted one resumes from its own
latest checkpoint (it is an ordinary hpckit experiment), the others start.

Where trials run: :meth:`Tuner._run` (packed under mpirun/srun, job steps in a Slurm
allocation, ranks started here, or one after another).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hpckit import logs
from hpckit import settings as _settings
from hpckit.config import RunConfig
from hpckit.errors import ConfigError, ManifestError, TrainingFailedError
from hpckit.experiment.values import jsonable
from hpckit.launch import mainimport
from hpckit.logs import log
from hpckit.result import Result
from hpckit.run.job import DEFAULT_STORAGE
from hpckit.run.mpi.comm import on_root, world
from hpckit.storage.location import Location, resolve
from hpckit.sweep import space, trialqueue
from hpckit.sweep.allocated import across_nodes, run_allocated
from hpckit.sweep.config import TuneConfig
from hpckit.sweep.packed import run_packed
from hpckit.sweep.progress import Progress
from hpckit.sweep.record import (
    ERROR,
    RUNNING,
    TERMINATED,
    SweepManifest,
    SweepRecord,
    Trial,
    dirname,
)
from hpckit.sweep.results import ResultGrid
from hpckit.sweep.spawned import run_spawned
from hpckit.sweep.trials import (
    Trainable,
    check_trainable,
    finished,
    prepared,
    ranks_per_trial,
    run_trial,
    trial_run_config,
)

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


class Tuner:
    """As ``ray.tune.Tuner``."""

    def __init__(self, trainable: Trainable, *, param_space: dict[str, Any] | None = None,
                 tune_config: TuneConfig | None = None, run_config: RunConfig | None = None,
                 _resume_errored: bool = False) -> None:
        check_trainable(trainable)
        for name, value, kind in (("tune_config", tune_config, TuneConfig),
                                  ("run_config", run_config, RunConfig)):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"Tuner({name}={value!r}) must be a {kind.__name__}.")
        self.param_space = param_space
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
        self.trainable = prepared(trainable, self.run_config)
        self._resume_errored = _resume_errored
        self._results: ResultGrid | None = None

    @classmethod
    def restore(cls, path: str, trainable: Trainable, *, param_space: dict[str, Any] | None = None,
                resume_unfinished: bool = True, resume_errored: bool = False,
                storage_filesystem: Any = None) -> Tuner:
        """The sweep at ``path``, to be continued by ``fit()``: its trials as recorded."""
        if not resume_unfinished:
            raise ConfigError("Tuner.restore(resume_unfinished=False) is not supported: "
                              "unfinished trials are always resumed.")
        location = resolve(path, storage_filesystem)
        found = SweepRecord(location).load()
        if found is None:
            raise ManifestError(f"{location.display} holds no sweep ({location.join('sweep.json').display} "
                                "is missing); pass the directory that Tuner.fit() printed.")
        tune_config = TuneConfig(metric=found.metric, mode=found.mode,  # type: ignore[arg-type]
                                 num_samples=found.num_samples, seed=found.seed)
        run_config = RunConfig(name=location.name, storage_path=location.parent.path,
                               storage_filesystem=None if location.is_local else location.filesystem)
        return cls(trainable, param_space=param_space, tune_config=tune_config,
                   run_config=run_config, _resume_errored=resume_errored)

    @classmethod
    def can_restore(cls, path: str, storage_filesystem: Any = None) -> bool:
        return SweepRecord(resolve(path, storage_filesystem)).load() is not None

    def fit(self) -> ResultGrid:
        """Run every trial not yet finished; the grid of all of them."""
        if mainimport.importing_main:  # a rank re-running the script stops here
            raise mainimport.MainImported()
        current = _settings.refresh()
        location = self._location(current)
        record = SweepRecord(location)
        comm = world() if current.launcher is not None else None
        logs.configure(comm.rank if comm is not None else 0)
        if comm is not None:
            trialqueue.check(comm.size, ranks_per_trial(self.trainable))
        share = current.array_share
        manifest = self._agree(comm, record, location, shared=share is not None)
        params = self._params(manifest)
        todo = self._todo(manifest, share)
        log.info("sweep %s: %d trial(s), %d to run%s", location.display, len(manifest.trials),
                 len(todo), f" (array task {share[0]} of {share[1]})" if share else "")
        # Array tasks share the sweep: once planned, its trials' own manifests say how each went.
        writer = record if share is None else None
        shown = current.progress if comm is None or comm.rank == 0 else False
        with Progress(location, manifest, shown):
            manifest = self._run(comm, manifest, params, todo, writer, location)
        if share is not None:  # the other tasks' trials, as far as they have got
            manifest = _on_root(comm, lambda: _with_finished_trials(manifest, location))
        self._results = self._grid(manifest, params, location)
        return self._results

    def _run(self, comm: Comm | None, manifest: SweepManifest, params: dict[int, dict[str, Any]],
             todo: list[int], writer: SweepRecord | None, location: Location) -> SweepManifest:
        """The trials ``todo``: packed onto ``comm``'s ranks (:mod:`hpckit.sweep.packed`), or
        each a job step across the Slurm allocation this process runs in (:mod:`.allocated`),
        or onto ``max_concurrent_trials`` groups of ranks started here (:mod:`.spawned`), or
        one after another here."""
        groups = min(self.tune_config.max_concurrent_trials or 1, len(todo))
        if comm is None and todo and (allocation := across_nodes(_settings.current())):
            return run_allocated(self, manifest, todo, writer, location, allocation,
                                 _settings.current())
        if comm is None and groups > 1:
            run_spawned(self, groups * ranks_per_trial(self.trainable), _settings.current())
            return _with_finished_trials(SweepRecord(location).load() or manifest, location)
        if comm is None:
            for index in todo:
                manifest = self._one_by_one(manifest.trials[index], params[index], manifest,
                                            writer, location)
            return manifest
        ended = run_packed(comm, ranks_per_trial(self.trainable),
                           self.tune_config.max_concurrent_trials, todo,
                           lambda i, group: self._attempt(manifest.trials[i], params[i],
                                                          location, group))
        for trial in ended:
            manifest = manifest.with_trial(trial)
        if comm.rank == 0 and writer is not None:
            writer.save(manifest)
        return manifest

    def get_results(self) -> ResultGrid:
        if self._results is None:
            raise ConfigError("Tuner.get_results() comes after fit() (or use Tuner.restore()"
                              " and fit() to finish the sweep first).")
        return self._results

    def _location(self, current: _settings.Settings) -> Location:
        root = resolve(self.run_config.storage_path or current.storage or DEFAULT_STORAGE,
                       self.run_config.storage_filesystem)
        name = self.run_config.name or current.name or _default_name(self.trainable)
        return root.join(name)

    def _todo(self, manifest: SweepManifest, share: tuple[int, int] | None) -> list[int]:
        """The trials to run: unfinished ones (errored ones too when resumed so), and of a
        Slurm array task only its share (by trial index, the same in every rerun)."""
        todo = [t.index for t in manifest.trials
                if t.status != TERMINATED and (t.status != ERROR or self._resume_errored)]
        if share is None:
            return todo
        position, count = share
        return [index for index in todo if index % count == position]

    def _agree(self, comm: Comm | None, record: SweepRecord, location: Location,
               shared: bool) -> SweepManifest:
        """Rank 0 reads or creates the sweep manifest; every rank gets the same one, or the
        same error."""
        manifest: SweepManifest = _on_root(comm, lambda: _with_finished_trials(self._planned(record, shared),
                                                                  location))
        return manifest

    def _planned(self, record: SweepRecord, shared: bool) -> SweepManifest:
        """The sweep manifest found, or planned and saved. Array tasks that plan it at once
        must draw the same trials: their default seed comes from the sweep's name."""
        found = record.load()
        config = self.tune_config
        seed = found.seed if found else config.seed
        if seed is None:
            seed = (zlib.crc32(record.location.name.encode()) if shared
                    else random.SystemRandom().randrange(2**31))
        if self.param_space is None and found is not None:
            return found
        trials = space.expand(self.param_space or {}, config.num_samples, seed)
        paths = space.varied(self.param_space or {})
        planned = SweepManifest(record.location.name, seed, config.num_samples, config.metric,
                                config.mode, tuple(
                                    Trial(i, self._dirname(i, p, paths), jsonable(p))
                                    for i, p in enumerate(trials)))
        if found is None:
            record.save(planned)
            return planned
        if [t.config for t in found.trials] != [t.config for t in planned.trials]:
            raise ConfigError(
                f"{record.file.display} was made from another param_space or num_samples; "
                "give this sweep another RunConfig(name=...), or restore it as it was "
                "(Tuner.restore(path, trainable) without param_space).")
        return found

    def _dirname(self, index: int, params: dict[str, Any], paths: list[tuple[str, ...]]) -> str:
        creator = self.tune_config.trial_dirname_creator
        if creator is None:
            return dirname(index, params, paths)
        trial = Trial(index, "", params)
        name = creator(trial)
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ConfigError(f"trial_dirname_creator returned {name!r} for trial {index}: "
                              "return a non-empty directory name without '/'.")
        return name

    def _params(self, manifest: SweepManifest) -> dict[int, dict[str, Any]]:
        """The exact params of each trial: drawn again from the seed (JSON may have lost
        their types), or as recorded when the sweep is restored without its param_space."""
        if self.param_space is None:
            return {t.index: t.config for t in manifest.trials}
        drawn = space.expand(self.param_space, manifest.num_samples, manifest.seed)
        return dict(enumerate(drawn))

    def _one_by_one(self, trial: Trial, params: dict[str, Any], manifest: SweepManifest,
                    writer: SweepRecord | None, location: Location) -> SweepManifest:
        """One trial in this process, the sweep manifest saying so before and after."""
        manifest = manifest.with_trial(replace(trial, status=RUNNING, error=None))
        if writer is not None:
            writer.save(manifest)
        manifest = manifest.with_trial(self._attempt(trial, params, location, None))
        if writer is not None:
            writer.save(manifest)
        return manifest

    def _attempt(self, trial: Trial, params: dict[str, Any], location: Location,
                 group: Comm | None) -> Trial:
        """Run one trial (on ``group``'s ranks, or as fit() does); the trial as it ended."""
        log.info("trial %s starts: %s", trial.dirname, trial.config)
        try:
            result = run_trial(self.trainable, params,
                               trial_run_config(self.run_config, location, trial.dirname), group)
        except TrainingFailedError as exc:
            log.error("trial %s failed: %s", trial.dirname, exc)
            first = str(exc).splitlines()[0] if str(exc) else ""  # the trial's manifest has all
            return replace(trial, status=ERROR, error=f"{type(exc).__name__}: {first}")
        log.info("trial %s finished: %s", trial.dirname, result.metrics)
        return replace(trial, status=TERMINATED, error=None, last=jsonable(result.metrics or {}))

    def _grid(self, manifest: SweepManifest, params: dict[int, dict[str, Any]],
              location: Location) -> ResultGrid:
        results = []
        for trial in manifest.trials:
            directory = location.join(trial.dirname)
            try:
                result = Result.from_path(directory.path,
                                          None if directory.is_local else directory.filesystem)
            except ManifestError:  # never started
                result = Result(None, None, None, directory.path)
            if trial.status == ERROR and result.error is None:
                result.error = TrainingFailedError(trial.error or "the trial failed")
            result.config = params[trial.index]
            results.append(result)
        return ResultGrid(results, manifest, location.display)


def _with_finished_trials(manifest: SweepManifest, location: Location) -> SweepManifest:
    """The manifest with every trial whose own run finished marked so: under mpirun, only
    the end of a sweep records the trials the other groups ran, and a killed sweep never
    got there."""
    for trial in manifest.trials:
        if trial.status != TERMINATED:
            last = finished(location.join(trial.dirname))
            if last is not None:
                manifest = manifest.with_trial(replace(trial, status=TERMINATED, error=None,
                                                       last=jsonable(last)))
    return manifest


def _on_root(comm: Comm | None, read: Any) -> Any:
    """What rank 0 reads, on every rank (``read`` runs once when there is no ``comm``); an
    error there is raised on every rank (a ConfigError as it is)."""
    if comm is None:
        return read()
    return on_root(comm, lambda: (None, read()), "reading the sweep manifest", ConfigError)[1]


def _default_name(trainable: Trainable) -> str:
    """Stable, so that running the script again resumes the sweep."""
    fn = getattr(trainable, "train_loop_per_worker", trainable)
    return f"{getattr(fn, '__name__', 'trainable')}_sweep"
