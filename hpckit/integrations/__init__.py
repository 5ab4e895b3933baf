"""Integrations with frameworks and formats: PyTorch (process group, devices, DDP, loading
checkpoints), PyTorch Lightning, Hugging Face Transformers and HDF5 datasets. Each is
optional at run time: importing hpckit imports none.

May import: the launch and run layers and everything below them.
"""
