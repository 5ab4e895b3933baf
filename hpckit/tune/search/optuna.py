"""``OptunaSearch``, as ``ray.tune.search.optuna`` names it (needs the ``optuna`` extra:
``pip install 'hpckit[optuna]'``)."""

from __future__ import annotations

from hpckit.sweep.search.optuna import OptunaSearch

__all__ = ["OptunaSearch"]
