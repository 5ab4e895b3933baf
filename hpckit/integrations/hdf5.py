"""HDF5Dataset: lazy, per-worker reads of HDF5 datasets, safe with DataLoader workers."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset

from hpckit.errors import ConfigError


class HDF5Dataset(Dataset):
    """Samples ``i`` of several equally long HDF5 datasets, e.g. ``("images", "labels")``.

    The file is opened lazily in each process that reads (h5py handles must not cross a
    fork), so the dataset is cheap to pickle into DataLoader workers. Combined with
    ``prepare_data_loader`` each rank reads only its own share of the indexes. hpckit's own
    (Ray Data has its readers).

    Args:
        path: The HDF5 file, on a filesystem every rank sees.
        keys: The names of its datasets to read, at least one, all of the same length;
            sample ``i`` is the tuple of their ``i``-th rows, as tensors.
        transform: A function applied to each sample's tuple; None (the default) returns it
            as is.

    Raises:
        ConfigError: No key is given, the file cannot be opened, a dataset is missing, or
            the datasets differ in length.
    """

    def __init__(self, path: str | os.PathLike[str], keys: tuple[str, ...] | list[str],
                 transform: Any = None) -> None:
        import h5py

        self.path = os.fspath(path)
        self.keys = tuple(keys)
        self.transform = transform
        if not self.keys:
            raise ConfigError("HDF5Dataset needs at least one dataset key, e.g. ('images', 'labels').")
        try:
            with h5py.File(self.path, "r") as f:
                missing = [k for k in self.keys if k not in f]
                if missing:
                    raise ConfigError(f"HDF5 file {self.path} has no dataset {missing[0]!r}; it has "
                                      f"{sorted(f.keys())}.")
                lengths = {k: len(f[k]) for k in self.keys}
        except OSError as exc:
            raise ConfigError(f"cannot open HDF5 file {self.path}: {exc}") from None
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"HDF5 datasets in {self.path} differ in length: {lengths}.")
        self.length = next(iter(lengths.values()))
        self._file: Any = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return self.length

    def _open(self) -> Any:
        if self._file is None or self._pid != os.getpid():
            import h5py

            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        f = self._open()
        sample = tuple(torch.as_tensor(f[k][index]) for k in self.keys)
        return self.transform(sample) if self.transform else sample

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": None}
