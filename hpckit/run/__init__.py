"""The rank side of a run: what every rank executes between start-up and exit.

Owns: MPI primitives (``comm``: collective steps that fail on every rank together;
``waiting``: their messages, waited for where Ctrl-C reaches the rank), the
commit protocol behind ``report()`` (``plan`` pure, ``persist``, ``commit``), the session and
``TrainContext`` that the training function sees, stop requests, the retry policy, one
attempt and the loop of attempts (``attempt``, ``ranks``), and the rank-side exit path.

May import: result, experiment, checkpoint, storage and the ground layer. Never the launch
layer: the parent process that starts ranks builds on this one, not the other way round.
"""
