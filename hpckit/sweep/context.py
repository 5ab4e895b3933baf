"""``tune.get_context()``: a trial's rank knows its place in the job (as
``hpckit.get_context()``) and which trial it runs: ``get_trial_name``, ``get_trial_id``,
``get_trial_dir``. The trial is the one the sweep's placement entered on this rank; on ranks
that a trainer started for it, the one whose directory the run writes, as ``sweep.json``
beside it names it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpckit.errors import HpckitError, ManifestError
from hpckit.run.session.context import TrainContext
from hpckit.run.session.session import get_context as _train_context
from hpckit.sweep.record import SweepRecord


@dataclass(frozen=True)
class TrialInfo:
    trial_id: str
    name: str
    dirname: str


_entered: TrialInfo | None = None
_found: dict[str, TrialInfo | None] = {}


@contextlib.contextmanager
def entered(info: TrialInfo) -> Iterator[None]:
    """This rank runs the trial ``info`` while the block runs."""
    global _entered
    previous, _entered = _entered, info
    try:
        yield
    finally:
        _entered = previous


class TuneContext:
    """As ``ray.tune.get_context()``'s: the trial's, and everything of
    :class:`hpckit.run.session.context.TrainContext` (ranks, experiment, storage).

    ``tune.get_context()`` builds it.

    Args:
        train: This rank's ``TrainContext``, whose methods this context also has.
        trial: The trial this rank runs (its id, name and directory), or None outside a
            sweep's trial (then the trial's methods raise ``HpckitError``).
    """

    def __init__(self, train: TrainContext, trial: TrialInfo | None) -> None:
        self._train = train
        self._trial = trial

    def __getattr__(self, name: str) -> Any:
        return getattr(self._train, name)

    def _info(self) -> TrialInfo:
        if self._trial is None:
            raise HpckitError("tune.get_context(): this run is not a trial of a sweep; the trial's "
                              "name, id and directory exist inside Tuner.fit()'s trials.")
        return self._trial

    def get_trial_name(self) -> str:
        """The trial's name: TuneConfig's ``trial_name_creator``'s, else its directory's."""
        return self._info().name

    def get_trial_id(self) -> str:
        """The trial's id in the sweep (``00003``), as its searcher and scheduler know it."""
        return self._info().trial_id

    def get_trial_dir(self) -> str:
        """The trial's directory (its experiment) as a path on the storage filesystem."""
        return self._train.get_experiment_path()

    def get_trial_resources(self) -> dict[str, int]:
        """The trial's ranks, as hpckit gives them (Ray's resources have no meaning here)."""
        return {"CPU": self._train.get_world_size()}


def get_context() -> TuneContext:
    """This trial's context: ``get_trial_name()``, ``get_trial_id()``, ``get_trial_dir()``, and
    every method of ``hpckit.get_context()``."""
    train = _train_context()
    return TuneContext(train, _entered or _lookup(train))


def _lookup(train: TrainContext) -> TrialInfo | None:
    """The trial whose directory this run writes, as sweep.json names it (read once)."""
    key = train.experiment.path
    if key not in _found:
        _found[key] = None
        with contextlib.suppress(ManifestError, HpckitError):
            sweep = SweepRecord(train.experiment.parent).load()
            for trial in sweep.trials if sweep else ():
                if trial.dirname == train.experiment.name:
                    _found[key] = TrialInfo(trial.trial_id, trial.dirname, trial.dirname)
    return _found[key]
