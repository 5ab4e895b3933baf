"""Sweeps: many trials of one training function, as Ray Tune runs them. Search spaces and
the trials they expand to (``space``), ``TuneConfig``, the sweep manifest (``record``, rank
0's), one trial's trainer (``trials``), the ``Tuner`` and its ``ResultGrid``; the sweep's
decisions in one room on its rank 0 (``controller``, with ``schedulers/`` and ``search/``,
``searching``, ``decisions``, PBT's ``exploit``); where trials
run (``trialqueue`` under mpirun/srun, and with ``worker`` when ``python sweep.py`` starts
the ranks itself); what a person sees of them (``progress``). Each trial is an ordinary
hpckit experiment under the sweep's directory. Users import it as ``hpckit.tune``.

May import: the integrations, launch and run layers and everything below them.
"""
