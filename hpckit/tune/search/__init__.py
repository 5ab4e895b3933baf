"""Ray Tune's search algorithms, as ``ray.tune.search`` names them (the code:
:mod:`hpckit.sweep.search`); ``hpckit.tune.search.optuna.OptunaSearch`` needs the ``optuna``
extra."""

from __future__ import annotations

from hpckit.sweep.search import BasicVariantGenerator, ConcurrencyLimiter, Repeater, Searcher

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter", "Repeater", "Searcher"]
