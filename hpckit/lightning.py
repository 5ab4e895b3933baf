"""PyTorch Lightning on hpckit, with Ray Train's names (``ray.train.lightning``): a Ray
program's Lightning code runs after ``from ray.train.lightning import ...`` becomes
``from hpckit.lightning import ...``. Needs the extra: ``pip install 'hpckit[lightning]'``.

Each name is imported when first used, so importing this module costs nothing until then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpckit.integrations.lightning.callback import RayTrainReportCallback
    from hpckit.integrations.lightning.environment import RayLightningEnvironment
    from hpckit.integrations.lightning.prepare import prepare_trainer
    from hpckit.integrations.lightning.strategy import RayDDPStrategy

_WHERE = {
    "RayDDPStrategy": "hpckit.integrations.lightning.strategy",
    "RayLightningEnvironment": "hpckit.integrations.lightning.environment",
    "RayTrainReportCallback": "hpckit.integrations.lightning.callback",
    "prepare_trainer": "hpckit.integrations.lightning.prepare",
}

__all__ = ["RayDDPStrategy", "RayLightningEnvironment", "RayTrainReportCallback",
           "prepare_trainer"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hpckit.lightning' has no attribute {name!r}")
    try:
        module = importlib.import_module(_WHERE[name])
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("lightning"):
            raise
        raise ModuleNotFoundError(f"hpckit.lightning.{name} needs PyTorch Lightning, which is "
                                  "not installed: pip install 'hpckit[lightning]'",
                                  name=exc.name) from None
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
