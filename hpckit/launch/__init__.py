"""The parent side of a run: deciding how ranks start, starting them, and retrying.

Owns: the public trainers' ``fit()`` (run here, or start ranks first), starting ranks and
waiting for them (``spawn``, ``script``, ``process``): under mpiexec on this node, or with srun
across a Slurm allocation, leaving lost nodes out (``steps``, ``allocation``, ``heartbeat``,
``lost``), the rank entry point
(``worker``) and the import of the user's script in it (``mainimport``), and the sbatch
script that ``hpckit resume --sbatch`` writes.

May import: the run layer and everything below it. The run layer never imports this one:
a rank is handed a :class:`~hpckit.run.job.TrainingJob` value, not the launcher.
"""
