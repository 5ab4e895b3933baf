"""Weights & Biases on hpckit, with Ray's names (``ray.air.integrations.wandb``): a Ray
program's W&B code runs after ``from ray.air.integrations.wandb import ...`` becomes
``from hpckit.wandb import ...``. Needs the extra: ``pip install -e '.[wandb]'`` in hpckit's
clone. See docs/tracking.md.

Each name is imported when first used, so importing this module costs nothing until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpckit.integrations.optional import lazy_names

if TYPE_CHECKING:
    from hpckit.integrations.wandb import WandbLoggerCallback, setup_wandb

__all__ = ["WandbLoggerCallback", "setup_wandb"]


__getattr__, __dir__ = lazy_names(__name__, "hpckit.integrations.wandb", __all__,
                                  "wandb", ("wandb",))
