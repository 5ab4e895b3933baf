"""Validation of committed checkpoints apart from the training ranks (Ray 2.60's
``ValidationConfig``): rank 0 hands each checkpoint to a validation process, in report
order, while the ranks train on; each outcome goes into the checkpoint's manifest record
through the experiment (``validator``). The process is ``python -m hpckit.launch.validator``,
which imports the user's script as a rank does (``child``); it runs on rank 0's node, in a
Slurm job of its own (``child`` too), or on ranks set aside from training (``pool``).

May import: ``job`` and the rooms below it, experiment, checkpoint, storage and the ground
layer.
"""
