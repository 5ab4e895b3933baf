"""The experiment: one directory per run on storage, and the one object that changes it.

Owns: the manifest (an immutable value, versioned JSON), attempts and their status, the
lock (also the fence each write of a run passes), the metrics log and its TensorBoard
scalars, retention (which checkpoints to keep), verification, the background purge of
evicted checkpoints, mirrors and artifacts. Only
:class:`~hpckit.experiment.experiment.Experiment` writes the manifest, the lock and the
metrics log; :mod:`~hpckit.experiment.reading` reads them for anyone.

May import: storage and the ground layer (errors, config, settings, logs, faults,
processes). Knows nothing of MPI, ranks or training.
"""
