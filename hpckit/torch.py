"""The PyTorch side of hpckit: the trainer, DDP preparation, and HDF5 data."""

from __future__ import annotations

from hpckit._distributed import device as get_device
from hpckit._hdf5 import HDF5Dataset
from hpckit._load import load_state
from hpckit._prepare import prepare_data_loader, prepare_model
from hpckit._trainer import TorchTrainer

__all__ = [
    "HDF5Dataset", "TorchTrainer", "get_device", "load_state", "prepare_data_loader", "prepare_model",
]
