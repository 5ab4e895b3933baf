"""The commit protocol behind ``report()``, in two roles: the collective steps every rank
takes (``protocol``) and rank 0's decisions, the plan of each step, the commits and the
reports not yet written to the experiment, in report order, the background commits handed
to the experiment's writer, and the run's UserCallbacks, called on rank 0 outside the
collectives (``coordinator``; its pure part, the plan made from the announcements and the
records merged and checked: ``planning``).

The experiment directory changes only through rank 0's
:class:`~hpckit.experiment.experiment.Experiment` (manifest, metrics, markers, discarded
checkpoints) and, for the files inside a pending checkpoint, through ``run.writing`` (and
``run.levels`` for a cached checkpoint copied to storage_path).

May import: ``run.levels``, ``run.writing``, ``run.ending`` (stop requests), ``run.mpi``,
experiment, checkpoint, storage and the ground layer.
"""
