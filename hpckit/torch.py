"""The PyTorch side of hpckit: the trainer, DDP preparation, DCP, and HDF5 data.

Each name is imported when first used: ``from hpckit.torch import TorchTrainer`` does not
import torch (the ranks do, when they set up), and torch.distributed.checkpoint (half a
second) is imported only by a program that uses DCP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpckit.integrations.hdf5 import HDF5Dataset
    from hpckit.integrations.torch.config import TorchConfig
    from hpckit.integrations.torch.dcp import load_state_dcp, save_state_dcp
    from hpckit.integrations.torch.distributed import device as get_device
    from hpckit.integrations.torch.distributed import devices as get_devices
    from hpckit.integrations.torch.load import load_state
    from hpckit.integrations.torch.prepare import enable_reproducibility, prepare_data_loader, prepare_model
    from hpckit.integrations.torch.save import save_state
    from hpckit.integrations.torch.trainer import TorchTrainer

_WHERE = {
    "HDF5Dataset": ("hpckit.integrations.hdf5", "HDF5Dataset"),
    "TorchConfig": ("hpckit.integrations.torch.config", "TorchConfig"),
    "TorchTrainer": ("hpckit.integrations.torch.trainer", "TorchTrainer"),
    "enable_reproducibility": ("hpckit.integrations.torch.prepare",
                               "enable_reproducibility"),
    "get_device": ("hpckit.integrations.torch.distributed", "device"),
    "get_devices": ("hpckit.integrations.torch.distributed", "devices"),
    "load_state": ("hpckit.integrations.torch.load", "load_state"),
    "load_state_dcp": ("hpckit.integrations.torch.dcp", "load_state_dcp"),
    "prepare_data_loader": ("hpckit.integrations.torch.prepare", "prepare_data_loader"),
    "prepare_model": ("hpckit.integrations.torch.prepare", "prepare_model"),
    "save_state": ("hpckit.integrations.torch.save", "save_state"),
    "save_state_dcp": ("hpckit.integrations.torch.dcp", "save_state_dcp"),
}

__all__ = [
    "HDF5Dataset", "TorchConfig", "TorchTrainer", "enable_reproducibility", "get_device",
    "get_devices", "load_state", "load_state_dcp", "prepare_data_loader", "prepare_model",
    "save_state", "save_state_dcp",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hpckit.torch' has no attribute {name!r}")
    module, attribute = _WHERE[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
