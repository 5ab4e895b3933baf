"""``enable_reproducibility``: the same numbers from the same seed, as in Ray."""

from __future__ import annotations

import os
import random


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, NumPy and torch with ``seed`` and make torch choose deterministic
    algorithms (cuDNN without benchmarking, cuBLAS with a fixed workspace). Call it at the
    start of the training function, on every rank. Deterministic kernels can be slower, and
    an operation that has none then raises.

    Data loaders are not seeded here (Ray's ``prepare_data_loader`` seeds their workers):
    give yours a ``generator``, which ``prepare_data_loader`` keeps.

    Args:
        seed: The seed for Python's ``random``, NumPy's global generator and torch (default
            0); the same on every rank gives every rank the same streams.
    """
    import numpy as np
    import torch

    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
