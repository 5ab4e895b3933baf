"""What a launched rank does before and while MPI starts: catching a stop signal as early as
hpckit runs (``early``), removing the shared memory a killed incarnation left (``shm``), and
ending a rank whose peers never join MPI (``watchdog``).

May import: ``run.ending`` (to catch a stop signal early) and the ground layer.
"""
