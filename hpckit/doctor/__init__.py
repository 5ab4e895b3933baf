"""``hpckit doctor``: the checks a user runs on a new cluster before submitting a large job.

Owns: the checks (the MPI that mpi4py loaded and the launcher found, how the ranks were
launched, the torch build and GPUs, the storage path and the node-local cache, Slurm's
signal and requeue settings) and their findings, each with its fix. Run alone, under
``mpiexec`` or as ``srun hpckit doctor``: every rank checks what it sees, and rank 0 reports.

May import: launch (which mpiexec hpckit would use), run.mpi (the ranks' messages), storage,
settings and the ground layer. Never torch: the torch build is inspected in a child
process, which also measures how long ``import torch`` takes.
"""
