"""The class API of Ray Tune: ``tune.Trainable`` with ``setup``, ``step``,
``save_checkpoint``, ``load_checkpoint``, ``cleanup`` and ``reset_config``, run as one trial's
training function. Each ``step()`` is one report (``training_iteration`` counts them, as in
Ray); every ``checkpoint_freq`` iterations, and at the end with ``checkpoint_at_end``, the
report carries what ``save_checkpoint`` wrote.

``save_checkpoint(checkpoint_dir)`` may return the directory, a path inside it, a dict or
None; on resume ``load_checkpoint`` receives what Ray passes: the dict, the path inside the
restored directory, or the directory.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from typing import Any

from hpckit.checkpoint import Checkpoint
from hpckit.errors import ConfigError
from hpckit.run.ending.stop import criterion_met
from hpckit.run.session import session

META = ".tune_trainable.json"
STATE = ".tune_state.pkl"


class Trainable:
    """As ``ray.tune.Trainable``: subclass it and override ``setup`` and ``step`` (and the
    checkpoint methods to resume).

    Args:
        config: The trial's params, passed to :meth:`setup` (a copy) and kept as
            ``self.config``; None (the default) is ``{}``. hpckit constructs the class once
            per trial attempt.
    """

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self._iteration = 0
        self.setup(dict(self.config))

    @property
    def iteration(self) -> int:
        return self._iteration

    @property
    def training_iteration(self) -> int:
        return self._iteration

    def setup(self, config: dict[str, Any]) -> None:
        """Build the model; ``config`` is the trial's params.

        Args:
            config: A copy of the trial's params.
        """

    def step(self) -> dict[str, Any]:
        raise NotImplementedError("a tune.Trainable must define step(), returning its metrics")

    def save_checkpoint(self, checkpoint_dir: str) -> str | dict[str, Any] | None:
        """Save the state to resume from; called every ``checkpoint_frequency`` iterations
        and, with ``checkpoint_at_end``, after the last.

        Args:
            checkpoint_dir: A fresh local directory to write into, committed with the
                iteration's report.

        Returns:
            ``checkpoint_dir``, a path inside it, a dict (pickled beside the files), or
            None; :meth:`load_checkpoint` receives it back on resume.
        """
        return None

    def load_checkpoint(self, checkpoint: str | dict[str, Any]) -> None:
        """Restore from what ``save_checkpoint`` saved.

        Args:
            checkpoint: What Ray passes: the dict :meth:`save_checkpoint` returned, the
                path it returned (inside the restored directory), or the directory.
        """

    def cleanup(self) -> None:
        """Release what ``setup`` took."""

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Ray's hook for reusing this object for another trial; hpckit runs every trial as
        its own run and never calls it.

        Args:
            new_config: The next trial's params.

        Returns:
            Whether the object took the new config (False here).
        """
        return False


class ClassRunner:
    """A Trainable subclass as the training function of one trial."""

    def __init__(self, cls: type[Trainable], checkpoint_freq: int = 0,
                 checkpoint_at_end: bool = False, stop: Any = None) -> None:
        if not isinstance(cls, type) or not issubclass(cls, Trainable):
            raise ConfigError(f"{cls!r} is not a tune.Trainable subclass.")
        self.cls, self.freq, self.at_end, self.stop = cls, checkpoint_freq, checkpoint_at_end, stop
        self.__name__ = cls.__name__

    def __call__(self, config: dict[str, Any]) -> None:
        trainable = self.cls(config)
        try:
            restored = session.get_checkpoint()
            if restored is not None:
                with restored.as_directory() as directory:
                    _load(trainable, directory)
            name = session.get_context().get_experiment_name()
            while True:
                result = dict(trainable.step() or {})
                trainable._iteration += 1
                result.setdefault("training_iteration", trainable._iteration)
                done = bool(result.get("done")) or criterion_met(self.stop, name, result,
                                                                 trainable._iteration)
                due = bool(self.freq) and trainable._iteration % self.freq == 0
                if due or (done and self.at_end):
                    _save_and_report(trainable, result)
                else:
                    session.report(result)
                if done:
                    return
        finally:
            trainable.cleanup()


def _save_and_report(trainable: Trainable, result: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="hpckit-trainable-") as directory:
        saved = trainable.save_checkpoint(directory)
        meta: dict[str, Any] = {"iteration": trainable._iteration, "kind": "dir"}
        if isinstance(saved, dict):
            with open(os.path.join(directory, STATE), "wb") as f:
                pickle.dump(saved, f)
            meta["kind"] = "dict"
        elif isinstance(saved, str) and os.path.abspath(saved) != os.path.abspath(directory):
            inside = os.path.relpath(os.path.abspath(saved), directory)
            if inside.startswith(".."):
                raise ConfigError(f"{type(trainable).__name__}.save_checkpoint returned {saved!r}, "
                                  f"outside the directory it was given ({directory}).")
            meta.update(kind="path", path=inside)
        with open(os.path.join(directory, META), "w") as f:
            json.dump(meta, f)
        session.report(result, checkpoint=Checkpoint.from_directory(directory))


def _load(trainable: Trainable, directory: str) -> None:
    with open(os.path.join(directory, META)) as f:
        meta = json.load(f)
    trainable._iteration = meta["iteration"]
    if meta["kind"] == "dict":
        with open(os.path.join(directory, STATE), "rb") as f:
            trainable.load_checkpoint(pickle.load(f))
    elif meta["kind"] == "path":
        trainable.load_checkpoint(os.path.join(directory, meta["path"]))
    else:
        trainable.load_checkpoint(directory)
