"""Ray Tune's search algorithms on hpckit's sweeps (users import them from
``hpckit.tune.search``): ``Searcher`` for one's own, ``BasicVariantGenerator`` (the default:
the grid and random draws of the space), the wrappers ``ConcurrencyLimiter`` and ``Repeater``,
and ``OptunaSearch`` (:mod:`.optuna`, on the optional ``optuna`` package)."""

from hpckit.sweep.search.searcher import Searcher
from hpckit.sweep.search.variants import BasicVariantGenerator
from hpckit.sweep.search.wrappers import ConcurrencyLimiter, Repeater

__all__ = ["BasicVariantGenerator", "ConcurrencyLimiter", "Repeater", "Searcher"]
