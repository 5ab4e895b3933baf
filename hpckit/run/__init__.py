"""The rank side of a run: what every rank executes between start-up and exit.

The rooms, top to bottom (each may import only the rooms below it; an import-linter
contract in pyproject.toml holds them to it):

- ``ranks``, ``attempt``: the loop of attempts on this MPI world, and one attempt (open the
  experiment, run the training function in a session, end the attempt).
- ``session``: what the training function calls (``report``, ``get_checkpoint``,
  ``get_context``, ``should_checkpoint``, ``get_preemption_info``, reported checkpoints).
- ``commit``: the commit protocol behind ``report()``: the collective steps, rank 0's
  plan, commits and reports not yet written, the UserCallbacks.
- ``validation``: rank 0 validating committed checkpoints in a process of its own while the
  ranks train (Ray 2.60's ``ValidationConfig``).
- ``levels``: node-local checkpoint caches, partner copies, restart from a cache.
- ``writing``: one checkpoint on the ranks: the plan rank 0 makes, what a rank hands in,
  the files each rank writes, and the checkpoints in flight in the background.
- ``job``, ``startup``: the training job (a value sent to the ranks); what a rank does
  before MPI is up.
- ``ending``: stop requests and signals, Ctrl-C, a failed rank's exit, the hang watchdog,
  the retry policy.
- ``mpi``: the world, its topology, collective steps that fail on every rank together, and
  waiting for other ranks where Ctrl-C reaches the waiting rank. The only room that waits
  on MPI (a test holds every other module to it).

May import: result, experiment, checkpoint, storage and the ground layer. Never the launch
layer: the parent process that starts ranks builds on this one, not the other way round.
"""
