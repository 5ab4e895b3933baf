"""Hugging Face Transformers' ``Trainer`` on hpckit's ranks, as Ray Train's
``ray.train.huggingface.transformers`` offers it: the report callback and
``prepare_trainer``. Public names in :mod:`hpckit.transformers`; the ``transformers`` package
is an optional extra (``pip install -e '.[transformers]'`` in hpckit's clone) that only these
modules import."""
