"""Tuner: Ray Tune's entry point. ``Tuner(trainable, param_space=..., tune_config=...,
run_config=...).fit()`` runs every trial of the search space and returns a ResultGrid.

Running the same script again (or ``Tuner.restore(path, trainable)``) resumes the sweep, as
Ray's ``resume="AUTO"``: finished trials are kept, an interrupted one resumes from its own
latest checkpoint (it is an ordinary hpckit experiment), the others start.

Trials run one after another here, each on all the ranks of this job (under mpirun/srun) or
on the ranks its trainer starts (under ``python sweep.py``).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from hpckit import settings as _settings
from hpckit.config import RunConfig
from hpckit.errors import ConfigError, ManifestError, TrainingFailedError
from hpckit.logs import log
from hpckit.result import Result
from hpckit.run.comm import world
from hpckit.run.job import DEFAULT_STORAGE, jsonable
from hpckit.storage.location import Location, resolve
from hpckit.sweep import space
from hpckit.sweep.config import TuneConfig
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
from hpckit.sweep.trials import Trainable, check_trainable, ranks_per_trial, run_trial, trial_run_config


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
        self.trainable = trainable
        self.param_space = param_space
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
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
        current = _settings.refresh()
        location = self._location(current)
        record = SweepRecord(location)
        comm = world() if current.launcher is not None else None
        self._check_ranks(comm)
        manifest = self._agree(comm, record)
        log.info("sweep %s: %d trial(s), %d finished", location.display, len(manifest.trials),
                 sum(t.status == TERMINATED for t in manifest.trials))
        params = self._params(manifest)
        for trial in manifest.trials:
            if trial.status == TERMINATED or (trial.status == ERROR and not self._resume_errored):
                continue
            manifest = self._run(trial, params[trial.index], manifest, record, location, comm)
        self._results = self._grid(manifest, params, location)
        return self._results

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

    def _check_ranks(self, comm: Any) -> None:
        if comm is None:
            return
        per_trial = ranks_per_trial(self.trainable)
        if per_trial != comm.size:
            raise ConfigError(
                f"each trial takes {per_trial} rank(s) but {comm.size} were launched: until "
                "hpckit packs several trials into one job, launch as many ranks as one trial "
                f"takes (mpirun -n {per_trial}), or run `python sweep.py` and let each trial "
                "start its own.")

    def _agree(self, comm: Any, record: SweepRecord) -> SweepManifest:
        """Rank 0 reads or creates the sweep manifest; every rank gets the same one."""
        manifest: SweepManifest | ConfigError | None = None
        if comm is None or comm.rank == 0:
            try:
                manifest = self._planned(record)
            except ConfigError as exc:
                manifest = exc
        if comm is not None:
            manifest = comm.bcast(manifest, root=0)
        if isinstance(manifest, ConfigError):
            raise manifest
        assert manifest is not None
        return manifest

    def _planned(self, record: SweepRecord) -> SweepManifest:
        found = record.load()
        config = self.tune_config
        seed = found.seed if found else (config.seed if config.seed is not None
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

    def _run(self, trial: Trial, params: dict[str, Any], manifest: SweepManifest,
             record: SweepRecord, location: Location, comm: Any) -> SweepManifest:
        writer = comm is None or comm.rank == 0
        manifest = manifest.with_trial(replace(trial, status=RUNNING, error=None))
        if writer:
            record.save(manifest)
        log.info("trial %s starts: %s", trial.dirname, trial.config)
        try:
            result = run_trial(self.trainable, params,
                               trial_run_config(self.run_config, location, trial.dirname))
            done = replace(trial, status=TERMINATED, error=None,
                           last=jsonable(result.metrics or {}))
        except TrainingFailedError as exc:
            log.error("trial %s failed: %s", trial.dirname, exc)
            first = str(exc).splitlines()[0] if str(exc) else ""  # the trial's manifest has all
            done = replace(trial, status=ERROR, error=f"{type(exc).__name__}: {first}")
        manifest = manifest.with_trial(done)
        if writer:
            record.save(manifest)
        return manifest

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


def _default_name(trainable: Trainable) -> str:
    """Stable, so that running the script again resumes the sweep."""
    fn = getattr(trainable, "train_loop_per_worker", trainable)
    return f"{getattr(fn, '__name__', 'trainable')}_sweep"
