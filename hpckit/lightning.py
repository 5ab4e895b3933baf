"""PyTorch Lightning on hpckit, with Ray Train's names (``ray.train.lightning``): a Ray
program's Lightning code runs after ``from ray.train.lightning import ...`` becomes
``from hpckit.lightning import ...``. Needs the extra: ``pip install -e '.[lightning]'`` in hpckit's clone.

Each name is imported when first used, so importing this module costs nothing until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpckit.integrations.optional import lazy_names

if TYPE_CHECKING:
    from hpckit.integrations.lightning import (
        RayDDPStrategy,
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

__all__ = ["RayDDPStrategy", "RayFSDPStrategy", "RayLightningEnvironment",
           "RayTrainReportCallback", "prepare_trainer"]


__getattr__, __dir__ = lazy_names(__name__, "hpckit.integrations.lightning", __all__,
                                  "lightning", ("lightning",))
