"""The ``hpckit`` command: inspect, manage and launch experiments from a shell.

Owns: the click group (``app``, with the one error mapping), and the commands in
``listing`` (ls; ``sweeps`` lists a sweep), ``inspect``, ``manage``, ``launch`` (run,
resume, sweep) and ``doctor`` (its checks live in :mod:`hpckit.doctor`); ``tables``
formats values for people; ``inspect``'s plot draws curves with matplotlib.

May import: every layer below it (doctor, launch, run, experiment, storage, ground). Nothing
imports it but the console script.
"""

from __future__ import annotations

from hpckit.cli import (  # noqa: F401  (the commands register on main)
    doctor,
    inspect,
    launch,
    listing,
    manage,
)
from hpckit.cli.app import main

__all__ = ["main"]
