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
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hpckit import logs
from hpckit import settings as _settings
from hpckit.config import RunConfig
from hpckit.errors import ConfigError, HpckitError, ManifestError, TrainingFailedError
from hpckit.experiment.values import jsonable
from hpckit.launch import mainimport
from hpckit.logs import log
from hpckit.result import Result
from hpckit.run.ending.retry import causes, recurring
from hpckit.run.job import DEFAULT_STORAGE, RESUMED_SWEEP, command_record
from hpckit.run.mpi.comm import on_root, world
from hpckit.storage.location import Location, resolve
from hpckit.sweep import space, trialqueue
from hpckit.sweep.allocated import across_nodes, run_allocated
from hpckit.sweep.config import TuneConfig
from hpckit.sweep.context import TrialInfo, entered
from hpckit.sweep.controller import Assignment, TuneController, resumed_statuses
from hpckit.sweep.decisions import Direct, ReportAsker, serving
from hpckit.sweep.exploit import adopt
from hpckit.sweep.progress import Progress
from hpckit.sweep.record import (
    ERROR,
    PAUSED,
    TERMINATED,
    SweepManifest,
    SweepRecord,
    Trial,
    dirname,
)
from hpckit.sweep.results import ResultGrid
from hpckit.sweep.search.searcher import Searcher
from hpckit.sweep.search.variants import BasicVariantGenerator
from hpckit.sweep.searching import Search, search_for
from hpckit.sweep.trialqueue import run_packed, run_spawned
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
    """As ``ray.tune.Tuner``.

    Each trial is an ordinary hpckit experiment under the sweep's directory
    (``{storage_path}/{name}/{trial}``); running the script again resumes the sweep.

    Args:
        trainable: What each trial runs: a training function ``fn(config)`` (one rank per
            trial), a ``tune.Trainable`` class, or a ``TorchTrainer``/``DataParallelTrainer``
            (its ``ScalingConfig``'s ranks per trial; each trial's params go into its
            ``train_loop_config``).
        param_space: The search space: params, ``tune.grid_search`` and distributions
            (``tune.uniform``, ...), nested as the config is; None (the default) is ``{}``.
        tune_config: The metric, the search and the scheduling; None (the default) is
            ``TuneConfig()``.
        run_config: The sweep's name and storage and each trial's checkpointing, failures
            and stop; None (the default) is ``RunConfig()``.

    Raises:
        ConfigError: ``trainable`` is none of these, or a config is not of its type.
    """

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
        """The sweep at ``path``, to be continued by ``fit()``: its trials as recorded.

        Args:
            path: The sweep's directory (what ``Tuner.fit()`` printed): a local path or a
                URI; with ``storage_filesystem``, a path on it without a scheme.
            trainable: What each trial runs, as for the constructor (Ray cannot pickle it
                into the sweep either).
            param_space: The search space; None (the default) continues the trials as
                recorded.
            resume_unfinished: Must be True (the default): unfinished trials are always
                resumed.
            resume_errored: Also resume the trials that failed; False by default.
            storage_filesystem: The pyarrow filesystem ``path`` is on; None (the default)
                finds it from ``path``.

        Raises:
            ConfigError: ``resume_unfinished`` is False.
            ManifestError: ``path`` holds no sweep.
        """
        if not resume_unfinished:
            raise ConfigError("Tuner.restore(resume_unfinished=False) is not supported: "
                              "unfinished trials are always resumed.")
        location = resolve(path, storage_filesystem)
        found = SweepRecord(location).load()
        if found is None:
            raise ManifestError(f"{location.display} holds no sweep ({location.join('sweep.json').display} "
                                "is missing); pass the directory that Tuner.fit() printed.")
        tune_config = TuneConfig(metric=found.metric, mode=found.mode,  # type: ignore[arg-type]
                                 num_samples=max(found.num_samples, 1), seed=found.seed)
        run_config = RunConfig(name=location.name, storage_path=location.parent.path,
                               storage_filesystem=None if location.is_local else location.filesystem)
        return cls(trainable, param_space=param_space, tune_config=tune_config,
                   run_config=run_config, _resume_errored=resume_errored)

    @classmethod
    def can_restore(cls, path: str, storage_filesystem: Any = None) -> bool:
        """Whether ``path`` holds a sweep that :meth:`restore` can continue.

        Args:
            path: The sweep's directory: a local path or a URI; with
                ``storage_filesystem``, a path on it without a scheme.
            storage_filesystem: The pyarrow filesystem ``path`` is on; None (the default)
                finds it from ``path``.
        """
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
        search = search_for(self.tune_config, self.param_space, self._dirname, share is not None)
        self._say_what_has_no_effect(comm)
        manifest = self._agree(comm, record, location, search, shared=share is not None)
        todo = self._todo(manifest, share)
        log.info("sweep %s: %d trial(s), %d to run%s", location.display, len(manifest.trials),
                 len(todo), f" (array task {share[0]} of {share[1]})" if share else "")
        # Array tasks share the sweep: once planned, its trials' own manifests say how each went.
        writer = record if share is None else None
        # Where this process starts the ranks, they decide: it only waits (and shows).
        spawning = comm is None and self._spawns(search, bool(todo))
        controller = None
        if not spawning and (comm is None or comm.rank == 0):
            controller = self._controller(manifest, record, writer, todo, search, location)
        shown = current.progress if comm is None or comm.rank == 0 else False
        source: Callable[[], SweepManifest] = (
            (lambda: controller.manifest) if controller is not None
            else (lambda: record.load() or manifest) if spawning else (lambda: manifest))
        with Progress(location, source, shown):
            manifest = self._run(comm, controller, manifest, location, spawning)
        if share is not None:  # the other tasks' trials, as far as they have got
            manifest = _on_root(comm, lambda: _with_finished_trials(manifest, location))
        self._results = self._grid(manifest, self._exact_params(manifest, controller), location)
        return self._results

    def _controller(self, manifest: SweepManifest, record: SweepRecord,
                    writer: SweepRecord | None, todo: list[int], search: Search | None,
                    location: Location) -> TuneController:
        """The sweep's decisions, on its rank 0: the scheduler's and searcher's state as the
        sweep kept it, or each trial added to them afresh."""
        controller = TuneController(resumed_statuses(manifest), self._params(manifest),
                                    location, writer, todo, search,
                                    live=search is not None)
        if search is not None and manifest.state:
            controller.restore(record.load_state(manifest.state))
        elif search is not None:
            for trial in controller.get_trials():
                if not trial.is_finished():
                    search.scheduler.on_trial_add(controller, trial)
        return controller

    def _spawns(self, search: Search | None, todo: bool) -> bool:
        """Whether ``python sweep.py`` starts groups of ranks on this node for the trials:
        ``max_concurrent_trials`` of them, or one where a scheduled trial takes several
        ranks (its reports are decided on the ranks' own rank 0)."""
        if across_nodes(_settings.current()) or not (todo or (search and search.dynamic)):
            return False
        several = ranks_per_trial(self.trainable) > 1
        return (self._max_concurrent() or 1) > 1 or (search is not None and several)

    def _run(self, comm: Comm | None, controller: TuneController | None,
             manifest: SweepManifest, location: Location, spawning: bool) -> SweepManifest:
        """The trials the controller hands out: packed onto ``comm``'s ranks
        (:mod:`hpckit.sweep.trialqueue`), or each a job step across the Slurm allocation this
        process runs in (:mod:`.allocated`), or onto ``max_concurrent_trials`` groups of ranks
        started here (:mod:`.spawned`), or one after another here."""
        concurrent = self._max_concurrent()
        if comm is not None:
            return run_packed(comm, ranks_per_trial(self.trainable), concurrent, controller,
                              lambda assignment, group: self._attempt(assignment, location, group))
        if spawning:  # the ranks decide on their own world rank 0; this process waits
            run_spawned(self, (concurrent or 1) * ranks_per_trial(self.trainable),
                        _settings.current())
            return _with_finished_trials(SweepRecord(location).load() or manifest, location)
        if controller is None or not controller.has_work():
            return controller.manifest if controller is not None else manifest
        if allocation := across_nodes(_settings.current()):
            return run_allocated(self, controller, location, allocation, _settings.current())
        return run_here(controller, lambda a: self._attempt(a, location, None))

    def _max_concurrent(self) -> int | None:
        """TuneConfig's, or the BasicVariantGenerator's ``max_concurrent``."""
        given = self.tune_config.search_alg
        limit = getattr(given, "max_concurrent", 0) if isinstance(given, BasicVariantGenerator) \
            else 0
        concurrent = self.tune_config.max_concurrent_trials
        return min(x for x in (concurrent, limit or None) if x) if (concurrent or limit) else None

    def _say_what_has_no_effect(self, comm: Comm | None) -> None:
        if self.tune_config.reuse_actors and (comm is None or comm.rank == 0):
            log.warning("TuneConfig(reuse_actors=True) has no effect: hpckit runs each trial as "
                        "a run of its own, on its slot's ranks")

    def get_results(self) -> ResultGrid:
        if self._results is None:
            raise ConfigError("Tuner.get_results() comes after fit() (or use Tuner.restore()"
                              " and fit() to finish the sweep first).")
        return self._results

    def _location(self, current: _settings.Settings) -> Location:
        """The sweep's directory; under ``hpckit resume SWEEP``, that sweep's, whatever the
        RunConfig names (said in one line where it names another)."""
        root = resolve(self.run_config.storage_path or current.storage or DEFAULT_STORAGE,
                       self.run_config.storage_filesystem)
        named = root.join(self.run_config.name or current.name or _default_name(self.trainable))
        if current.resume != RESUMED_SWEEP or not (current.name and current.storage):
            return named
        resumed = resolve(current.storage).join(current.name)
        if resumed.display != named.display:
            log.warning("hpckit resume continues %s, not %s that the script's "
                        "RunConfig(name=..., storage_path=...) names", resumed.display,
                        named.display)
        return resumed

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
               search: Search | None, shared: bool) -> SweepManifest:
        """Rank 0 reads or creates the sweep manifest; every rank gets the same one, or the
        same error."""
        command = {**command_record(_settings.current()),
                   "ranks": comm.size if comm is not None else 1, "array": shared}
        manifest: SweepManifest = _on_root(comm, lambda: _with_finished_trials(
            self._planned(record, search, shared, command), location))
        return manifest

    def _planned(self, record: SweepRecord, search: Search | None, shared: bool,
                 command: dict[str, Any]) -> SweepManifest:
        """The sweep manifest found, or planned and saved. Array tasks that plan it at once
        must draw the same trials: their default seed comes from the sweep's name. A search
        algorithm's trials are made as it suggests them: none is planned."""
        found = record.load()
        config = self.tune_config
        seed = found.seed if found else self._seed()
        if seed is None:
            seed = (zlib.crc32(record.location.name.encode()) if shared
                    else random.SystemRandom().randrange(2**31))
        names = _names(config, search)
        if found is not None and (self.param_space is None or (search and search.dynamic)):
            return replace(found, **names) if search else found
        trials = () if search and search.dynamic else tuple(
            Trial(i, self._dirname(i, p, space.varied(self.param_space or {})), jsonable(p))
            for i, p in enumerate(self._expand(config.num_samples, seed)))
        planned = SweepManifest(record.location.name, seed, config.num_samples, config.metric,
                                config.mode, trials, **names, command=command)
        if found is None:
            record.save(planned)
            return planned
        if _planned_configs(found) != [t.config for t in planned.trials]:
            raise ConfigError(
                f"{record.file.display} was made from another param_space or num_samples; "
                "give this sweep another RunConfig(name=...), or restore it as it was "
                "(Tuner.restore(path, trainable) without param_space).")
        return replace(found, **names) if search else found

    def _seed(self) -> int | None:
        given = self.tune_config.search_alg
        if isinstance(given, BasicVariantGenerator) and given.random_state is not None:
            return given.random_state
        return self.tune_config.seed

    def _expand(self, num_samples: int, seed: int) -> list[dict[str, Any]]:
        """The planned trials' params (BasicVariantGenerator's options where it was given)."""
        given = self.tune_config.search_alg
        options = given if isinstance(given, BasicVariantGenerator) else BasicVariantGenerator()
        return space.expand(self.param_space or {}, num_samples, seed,
                            options.points_to_evaluate, options.constant_grid_search)

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
        their types), or as recorded when the sweep is restored without its param_space, or
        made by a search algorithm (exact from the sweep's state, :meth:`TuneController.restore`)."""
        recorded = {t.index: t.config for t in manifest.trials}
        if self.param_space is None or isinstance(self.tune_config.search_alg, Searcher):
            return recorded
        drawn = self._expand(manifest.num_samples, manifest.seed)
        return {**recorded, **dict(enumerate(drawn))}

    def _exact_params(self, manifest: SweepManifest,
                      controller: TuneController | None) -> dict[int, dict[str, Any]]:
        if controller is None:
            return self._params(manifest)
        return {t.index: t.config for t in controller.get_trials_all()}

    def _attempt(self, assignment: Assignment, location: Location, group: Comm | None,
                 failures_end_step: bool = False) -> Trial:
        """Run one trial (on ``group``'s ranks, or as fit() does); the trial as it ended. A
        trial that exploited another starts from a copy of its newest checkpoint.
        ``failures_end_step``: a job step's trial, whose ranks do not restart themselves; a
        failure that a restart may mend is raised, for the step to end failed and the
        sweep's process to count it; a refusal that a restart would meet again ends the
        trial ``ERROR`` here."""
        trial = assignment.trial
        log.info("trial %s starts: %s", trial.dirname, jsonable(assignment.params))
        run_config = trial_run_config(self.run_config, location, trial.dirname)
        if assignment.live:
            run_config = replace(run_config, stop=ReportAsker(trial.index, run_config.stop))
        info = TrialInfo(trial.trial_id, self._trial_name(trial, assignment.params), trial.dirname)
        try:
            if assignment.donor is not None:
                self._adopt(location.join(trial.dirname), location.join(assignment.donor), group)
            with entered(info):
                result = run_trial(self.trainable, assignment.params, run_config, group)
        except TrainingFailedError as exc:
            log.error("trial %s failed: %s", trial.dirname, exc)
            if failures_end_step:
                if (why := recurring(causes(exc))) is None:
                    raise
                log.error("trial %s %s", trial.dirname, why)
            first = str(exc).splitlines()[0] if str(exc) else ""  # the trial's manifest has all
            return replace(trial, status=ERROR, error=f"{type(exc).__name__}: {first}")
        log.info("trial %s finished: %s", trial.dirname, result.metrics)
        return replace(trial, status=TERMINATED, error=None, last=jsonable(result.metrics or {}))

    def _adopt(self, trial: Location, donor: Location, group: Comm | None) -> None:
        """The donor's newest checkpoint copied into the trial's experiment, by the group's
        rank 0; a copy that fails leaves the trial to go on from its own checkpoint."""
        def copy() -> str | None:
            try:
                return adopt(trial, donor, self.run_config.checkpoint_config)
            except HpckitError as exc:
                log.warning("PBT: %s goes on from its own checkpoint: %s", trial.name, exc)
                return None
        _on_root(group, copy)

    def _trial_name(self, trial: Trial, params: dict[str, Any]) -> str:
        creator = self.tune_config.trial_name_creator
        if creator is None:
            return trial.dirname
        return str(creator(replace(trial, config=params)))

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
    got there. In a scheduled sweep a run that finished may have been paused: there the
    controller alone says how trials ended (it records each end as it comes)."""
    if manifest.scheduled:
        return manifest
    for trial in manifest.trials:
        if trial.status in (TERMINATED, PAUSED) or trial.decision is not None:
            continue
        last = finished(location.join(trial.dirname))
        if last is not None:
            manifest = manifest.with_trial(replace(trial, status=TERMINATED, error=None,
                                                   last=jsonable(last)))
    return manifest


def _planned_configs(found: SweepManifest) -> list[Any]:
    """The configs the sweep was planned with: an exploit changed its trial's (PBT), and
    its first event says what it was."""
    configs = []
    for trial in found.trials:
        exploits = [e for e in trial.events if e.get("event") == "exploited"]
        configs.append(exploits[0].get("before", trial.config) if exploits else trial.config)
    return configs


def run_here(controller: TuneController, attempt: Callable[[Assignment], Trial]) -> SweepManifest:
    """The trials one after another in this process, reporting to the controller directly."""
    with serving(Direct(controller)):
        while True:
            assignment = controller.next_trial()
            if not isinstance(assignment, Assignment):
                break  # None: done; WAIT cannot last with nothing running here
            controller.on_ended(attempt(assignment))
    return controller.manifest


def _names(config: TuneConfig, search: Search | None) -> dict[str, Any]:
    """What sweep.json says of a scheduled sweep's scheduler and search algorithm."""
    if search is None:
        return {}
    searcher = config.search_alg
    return {"scheduler": type(search.scheduler).__name__,
            "searcher": type(searcher).__name__ if searcher is not None else "BasicVariantGenerator"}


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
