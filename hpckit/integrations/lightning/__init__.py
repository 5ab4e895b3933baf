"""PyTorch Lightning on hpckit's ranks, as Ray Train's ``ray.train.lightning`` offers it: the
cluster environment, the DDP strategy, the report callback and ``prepare_trainer``. Public
names in :mod:`hpckit.lightning`; the ``lightning`` package is an optional extra
(``pip install -e '.[lightning]'`` in hpckit's clone) that only these modules import."""
