"""MLflow on hpckit, with Ray's names (``ray.air.integrations.mlflow``): a Ray program's
MLflow code runs after ``from ray.air.integrations.mlflow import ...`` becomes
``from hpckit.mlflow import ...``. Needs the extra: ``pip install -e '.[mlflow]'`` in hpckit's
clone. See docs/tracking.md.

Each name is imported when first used, so importing this module costs nothing until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpckit.integrations.optional import lazy_names

if TYPE_CHECKING:
    from hpckit.integrations.mlflow import MLflowLoggerCallback, setup_mlflow

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]


__getattr__, __dir__ = lazy_names(__name__, "hpckit.integrations.mlflow", __all__,
                                  "mlflow", ("mlflow",))
