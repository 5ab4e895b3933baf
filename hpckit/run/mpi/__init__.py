"""MPI primitives: a run's ranks, its nodes and their leaders (``group``), collective steps
that fail on every rank together (``comm``), waiting for other ranks in Python where Ctrl-C
reaches the waiting rank (``waiting``), MPI kept progressing after a rank leaves a step until
every rank has left it (``progress``), files sent from rank to rank (``transfer``), and which
MPI library mpi4py loads (``library``).

Every wait between ranks in hpckit goes through this package; no other module calls a
blocking MPI collective (``tests/test_invariants.py`` fails when one does).

May import: the ground layer (errors, logs). Nothing else of ``hpckit.run``.
"""
