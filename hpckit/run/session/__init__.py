"""The training session of one rank and what the training function calls through it:
``report``, ``get_checkpoint``, ``should_checkpoint``, ``get_all_reported_checkpoints``
(``session``), ``get_context`` (``context``), ``get_preemption_info`` (``preemption``). How a
session that a stop request stopped ends (requeued, or ``PreemptionError``) is the attempt's
(``run.attempt``).

May import: ``run.commit`` and every room below it.
"""
