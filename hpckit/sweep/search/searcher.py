"""The search algorithm's seam, as Ray Tune's ``Searcher``: the sweep's controller asks it for
each new trial's config (``suggest``) and tells it every result and each trial's end. Its
state is kept with the sweep through ``save``/``restore``, so a rerun goes on with the same
search (a searcher without them starts afresh, and says so once).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

from hpckit.errors import ConfigError

FINISHED = "FINISHED"


class Searcher:
    """As ``ray.tune.search.Searcher``: subclass it for a search algorithm of your own
    (``suggest`` and ``on_trial_complete`` at least; ``save`` and ``restore`` to go on with
    the same search when the sweep is run again).

    Args:
        metric: the metric to optimise (default: TuneConfig's).
        mode: "min" or "max" (default: TuneConfig's).
    """

    FINISHED = FINISHED
    CKPT_FILE_TMPL = "searcher-state-{}.pkl"

    def __init__(self, metric: str | list[str] | None = None,
                 mode: str | list[str] | None = None) -> None:
        modes = mode if isinstance(mode, list) else [mode]
        if any(m not in (None, "min", "max") for m in modes):
            raise ConfigError(f"{type(self).__name__}(mode={mode!r}) must be 'min' or 'max'.")
        if metric is not None and mode is not None and isinstance(metric, list) != isinstance(mode, list):
            raise ConfigError(f"{type(self).__name__}(metric={metric!r}, mode={mode!r}): give "
                              "both as strings, or both as lists of the same length.")
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> Any:
        return self._metric

    @property
    def mode(self) -> Any:
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict[str, Any], **spec: Any) -> bool:
        """Take TuneConfig's metric and mode and the Tuner's ``param_space``; False when the
        searcher cannot (the Tuner then says so).

        Args:
            metric: TuneConfig's metric.
            mode: TuneConfig's mode.
            config: the Tuner's param_space.
            **spec: further properties (unused).
        """
        return False

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Whether the searcher limits its live trials itself (else a ConcurrencyLimiter does).

        Args:
            max_concurrent: TuneConfig's ``max_concurrent_trials``.
        """
        return False

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The config of a new trial, None for none now (ask again later), or FINISHED.

        Args:
            trial_id: The new trial's id in the sweep (``00003``).
        """
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """A running trial reported ``result``.

        Args:
            trial_id: The trial's id.
            result: Its report's metrics, with ``training_iteration``.
        """

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        """A trial ended, with its last ``result`` (None when it failed before any).

        Args:
            trial_id: The trial's id.
            result: Its last report's metrics, or None (the default) where it reported none.
            error: Whether the trial failed; False by default.
        """
        raise NotImplementedError

    def add_evaluated_point(self, parameters: dict[str, Any], value: float, error: bool = False,
                            pruned: bool = False,
                            intermediate_values: list[float] | None = None) -> None:
        """Tell the searcher of a config evaluated elsewhere.

        Args:
            parameters: The evaluated config.
            value: Its value of the searcher's metric.
            error: Whether the evaluation failed; False by default.
            pruned: Whether it was stopped early; False by default.
            intermediate_values: The metric's values along the way, or None (the default).
        """
        raise NotImplementedError

    def save(self, checkpoint_path: str) -> None:
        """Write the searcher's state to ``checkpoint_path``.

        Args:
            checkpoint_path: A local file to write, kept with the sweep.
        """
        raise NotImplementedError

    def restore(self, checkpoint_path: str) -> None:
        """Read back what :meth:`save` wrote.

        Args:
            checkpoint_path: The file :meth:`save` wrote, when the sweep runs again.
        """
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`get_state` returned.

        Args:
            state: The searcher's state as :meth:`get_state` returned it.
        """
        raise NotImplementedError

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        """:meth:`save` into ``checkpoint_dir``, as ``searcher-state-{session_str}.pkl``.

        Args:
            checkpoint_dir: A local directory.
            session_str: The file name's tag; ``"default"`` by default.
        """
        self.save(os.path.join(checkpoint_dir, self.CKPT_FILE_TMPL.format(session_str)))

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        """:meth:`restore` from the last ``searcher-state-*.pkl`` in ``checkpoint_dir``.

        Args:
            checkpoint_dir: A local directory that :meth:`save_to_dir` wrote into.

        Raises:
            ConfigError: ``checkpoint_dir`` holds no such file.
        """
        names = sorted(n for n in os.listdir(checkpoint_dir)
                       if n.startswith("searcher-state-") and n.endswith(".pkl"))
        if not names:
            raise ConfigError(f"{checkpoint_dir} holds no searcher-state-*.pkl to restore from.")
        self.restore(os.path.join(checkpoint_dir, names[-1]))


def saved_bytes(searcher: Any) -> bytes | None:
    """What ``searcher.save`` writes, or None where it has no ``save``."""
    with tempfile.TemporaryDirectory(prefix="hpckit-searcher-") as directory:
        path = os.path.join(directory, "state")
        try:
            searcher.save(path)
        except NotImplementedError:
            return None
        with open(path, "rb") as f:
            return f.read()


def restore_bytes(searcher: Any, data: bytes) -> None:
    """``searcher.restore`` from what :func:`saved_bytes` returned."""
    with tempfile.TemporaryDirectory(prefix="hpckit-searcher-") as directory:
        path = os.path.join(directory, "state")
        with open(path, "wb") as f:
            f.write(data)
        searcher.restore(path)


def dump(path: str, state: dict[str, Any]) -> None:
    with open(path, "wb") as f:
        pickle.dump(state, f)


def load(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        state: dict[str, Any] = pickle.load(f)
    return state
