"""What a launched rank does before and while MPI starts: noting a stop signal from the
script's first line and choosing MPICH's network module under Slurm's PMI server (``hook``,
run by ``hpckit-early.pth`` as Python starts, standalone),
catching it as early as hpckit runs (``early``), removing the shared memory a killed
incarnation left (``shm``), and ending a rank whose peers never join MPI, and the node's
heartbeat (``watchdog``).

May import: ``run.ending`` (to catch a stop signal early) and the ground layer.
"""
