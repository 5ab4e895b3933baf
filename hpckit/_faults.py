"""Fault points: where hpckit's own fault-injection tests kill a rank, deterministically.

Off unless ``HPCKIT_FAULT`` is set; the variable is read once, when hpckit is imported, and
an unset variable costs one comparison per point. Its value is ``PHASE:RANK:N`` or
``PHASE:RANK:N:all``: the N-th time rank RANK reaches PHASE it kills itself with SIGKILL;
with ``all`` it kills its whole process group instead (every rank and the launcher, as when
a node loses power). The phases of the commit protocol, in the order a report meets them:

``writing``    a rank has persisted the first of its files; its others may not be written
``written``    a rank has persisted all of its files and not yet told rank 0
``gathered``   rank 0 holds every rank's outcome and has not replaced the manifest
``committed``  rank 0 has replaced the manifest and not yet applied retention
``evicting``   rank 0 has deleted part of a checkpoint that retention evicts

Random-time kills need no hook: the tests send SIGKILL from outside.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from hpckit._env import Environment, variable
from hpckit.errors import ConfigError

PHASES = ("writing", "written", "gathered", "committed", "evicting")


@dataclass(frozen=True)
class Fault:
    phase: str
    rank: int
    occurrence: int
    whole_group: bool

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":")
        if (len(parts) not in (3, 4) or parts[0] not in PHASES or not parts[1].isdigit()
                or not parts[2].isdigit() or int(parts[2]) < 1 or parts[3:] not in ([], ["all"])):
            raise ConfigError(
                f"{variable('fault')}={text!r} is invalid: use PHASE:RANK:N[:all] with PHASE one "
                f"of {', '.join(PHASES)}, e.g. 'written:1:2'. Unset it outside hpckit's tests.")
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3:] == ["all"])


_armed = Environment.read().fault
_fault = Fault.parse(_armed) if _armed else None
_seen = 0


def reached(phase: str, rank: int) -> None:
    """Mark that ``rank`` reached ``phase``; dies here when the armed fault says so."""
    global _seen
    if _fault is None or _fault.phase != phase or _fault.rank != rank:
        return
    _seen += 1
    if _seen == _fault.occurrence:
        if _fault.whole_group:
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
