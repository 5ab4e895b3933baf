"""How a rank stops and ends: stop requests from signals (Slurm's warning, SIGTERM) and Ctrl-C
(``stop``), a failed rank's exit that leaves no other rank waiting (``exit``, which also
tells hydra), the hang watchdog (``hang``), and how often a failed run is started again (``retry``).

Owns: the stop request this process received (``stop.received()``), the one source every
other room reads it from.

May import: ``run.mpi``, experiment (the layout of hang stacks), storage and the ground layer.
"""
