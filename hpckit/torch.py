"""The PyTorch side of hpckit: the trainer, DDP preparation, and HDF5 data."""

from __future__ import annotations

from hpckit.integrations.hdf5 import HDF5Dataset
from hpckit.integrations.torch.dcp import load_state_dcp, save_state_dcp
from hpckit.integrations.torch.distributed import device as get_device
from hpckit.integrations.torch.load import load_state
from hpckit.integrations.torch.prepare import prepare_data_loader, prepare_model
from hpckit.integrations.torch.trainer import TorchTrainer

__all__ = [
    "HDF5Dataset", "TorchTrainer", "get_device", "load_state", "load_state_dcp", "prepare_data_loader",
    "prepare_model", "save_state_dcp",
]
