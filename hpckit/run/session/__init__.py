"""The training session of one rank and what the training function calls through it:
``report``, ``get_checkpoint``, ``get_context`` (``session``, ``context``),
``should_checkpoint`` (``interval``), ``get_preemption_info`` (``preemption``) and
``get_all_reported_checkpoints`` (``reported``). How a session that a stop request stopped
ends (requeued, or ``PreemptionError``) is the attempt's (``run.attempt``).

May import: ``run.commit`` and every room below it.
"""
