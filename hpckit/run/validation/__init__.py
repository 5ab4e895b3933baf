"""Validation of committed checkpoints apart from the training ranks (Ray 2.60's
``ValidationConfig``): rank 0 runs the validation function in a process of its own on its
node, one checkpoint at a time and in report order, while the ranks train on; each outcome
goes into the checkpoint's manifest record through the experiment (``validator``). The
process is ``python -m hpckit.launch.validator``, which imports the user's script as a rank
does (``child``).

May import: ``job`` and the rooms below it, experiment, checkpoint, storage and the ground
layer.
"""
