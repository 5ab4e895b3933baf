"""PyTorch Lightning on hpckit, with Ray Train's names (``ray.train.lightning``): a Ray
program's Lightning code runs after ``from ray.train.lightning import ...`` becomes
``from hpckit.lightning import ...``. Needs the extra: ``pip install -e '.[lightning]'`` in hpckit's clone.

Each name is imported when first used, so importing this module costs nothing until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpckit.integrations.optional import lazy_names

if TYPE_CHECKING:
    from hpckit.integrations.lightning.callback import RayTrainReportCallback
    from hpckit.integrations.lightning.environment import RayLightningEnvironment
    from hpckit.integrations.lightning.prepare import prepare_trainer
    from hpckit.integrations.lightning.strategy import RayDDPStrategy, RayFSDPStrategy

_WHERE = {
    "RayDDPStrategy": "hpckit.integrations.lightning.strategy",
    "RayFSDPStrategy": "hpckit.integrations.lightning.strategy",
    "RayLightningEnvironment": "hpckit.integrations.lightning.environment",
    "RayTrainReportCallback": "hpckit.integrations.lightning.callback",
    "prepare_trainer": "hpckit.integrations.lightning.prepare",
}

__all__ = ["RayDDPStrategy", "RayFSDPStrategy", "RayLightningEnvironment",
           "RayTrainReportCallback", "prepare_trainer"]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, "lightning", ("lightning",))
