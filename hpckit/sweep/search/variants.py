"""``BasicVariantGenerator``, Ray Tune's default search algorithm: the grid and the random
draws of the search space (:func:`hpckit.sweep.space.expand`), all planned when the sweep
starts and recorded in ``sweep.json``; a rerun draws them again from the recorded seed."""

from __future__ import annotations

from typing import Any

from hpckit.config.values import is_int
from hpckit.errors import ConfigError


class BasicVariantGenerator:
    """As ``ray.tune.search.BasicVariantGenerator``.

    Args:
        points_to_evaluate: configs (or parts of them) for the first samples, run first.
        max_concurrent: the most trials running at once (0: as many as the slots allow).
        constant_grid_search: draw each sample's distributions once for all of its grid
            values (else fresh draws for every grid value).
        random_state: the seed of the draws (as ``TuneConfig(seed=...)``).
    """

    def __init__(self, points_to_evaluate: list[dict[str, Any]] | None = None,
                 max_concurrent: int = 0, constant_grid_search: bool = False,
                 random_state: int | None = None) -> None:
        if points_to_evaluate is not None and (not isinstance(points_to_evaluate, list) or not all(
                isinstance(p, dict) for p in points_to_evaluate)):
            raise ConfigError(f"BasicVariantGenerator(points_to_evaluate={points_to_evaluate!r}) "
                              "must be a list of dicts, e.g. [{'lr': 0.01}].")
        if not is_int(max_concurrent) or max_concurrent < 0:
            raise ConfigError(f"BasicVariantGenerator(max_concurrent={max_concurrent!r}) must be "
                              "an integer >= 0 (0: no limit).")
        if random_state is not None and not is_int(random_state):
            raise ConfigError(f"BasicVariantGenerator(random_state={random_state!r}) must be an "
                              "integer seed (hpckit draws with its own seeded generator).")
        self.points_to_evaluate = list(points_to_evaluate or [])
        self.max_concurrent = max_concurrent
        self.constant_grid_search = constant_grid_search
        self.random_state = random_state

    def set_search_properties(self, metric: str | None, mode: str | None,
                              config: dict[str, Any], **spec: Any) -> bool:
        """Take TuneConfig's metric and mode and the Tuner's ``param_space``, as a
        ``Searcher`` does; the generator needs none of them.

        Args:
            metric: TuneConfig's metric.
            mode: TuneConfig's mode.
            config: The Tuner's param_space.
            **spec: Further properties (unused).

        Returns:
            True: always accepted.
        """
        return True
