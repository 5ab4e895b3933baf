"""Integrations with frameworks, trackers and formats: PyTorch (``torch/``: process group,
devices, DDP, loaders, loading checkpoints, DCP), and one module each for PyTorch Lightning
(``lightning``), Hugging Face Transformers (``transformers``), MLflow (``mlflow``) and
Weights & Biases (``wandb``), what the two trackers share (``tracking``), HDF5 datasets
(``hdf5``), and the lazy public faces of the optional ones (``optional``). Each is optional at
run time: importing hpckit imports none, and each optional package is imported by its own
module alone.

May import: the launch and run layers and everything below them.
"""
