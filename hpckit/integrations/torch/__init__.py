"""PyTorch on hpckit's ranks: the process group and devices, DDP and sharded data loaders,
loading checkpoint files checked against the manifest. Public names in :mod:`hpckit.torch`."""
