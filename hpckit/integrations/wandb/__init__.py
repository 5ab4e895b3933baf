"""Weights & Biases on hpckit, as Ray offers it in ``ray.air.integrations.wandb``: the logger
callback (``callback``) and ``setup_wandb`` (``setup``). Public names in
:mod:`hpckit.wandb`; the ``wandb`` package is an optional extra (``pip install -e
'.[wandb]'`` in hpckit's clone) that only these modules import."""
