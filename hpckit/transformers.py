"""Hugging Face Transformers on hpckit, with Ray Train's names
(``ray.train.huggingface.transformers``): a Ray program's Trainer code runs after
``from ray.train.huggingface.transformers import ...`` becomes
``from hpckit.transformers import ...``. Needs the extra: ``pip install -e '.[transformers]'``
in hpckit's clone.

Each name is imported when first used, so importing this module costs nothing until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpckit.integrations.optional import lazy_names

if TYPE_CHECKING:
    from hpckit.integrations.transformers import RayTrainReportCallback, prepare_trainer

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


__getattr__, __dir__ = lazy_names(__name__, "hpckit.integrations.transformers", __all__,
                                  "transformers", ("transformers", "accelerate"))
