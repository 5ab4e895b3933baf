"""What hpckit's environment variables accept: each kind of value, its conversion from the
variable's text, and the words that say what is accepted when it is refused.

Ground layer: imports nothing of hpckit. :mod:`hpckit.settings` names the variables.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from dataclasses import dataclass

# The fault points of the commit protocol, in the order a report meets them (see run.faults).
FAULT_PHASES = ("writing", "written", "gathered", "committed", "evicting", "taking", "handed",
                "background", "persisted", "partnering", "draining", "staging", "serialising",
                "committing", "validating", "resume_state", "exploiting")
DEFAULT_STOP_SIGNAL = signal.SIGUSR2  # NCCL may use SIGUSR1 itself (submitit made the same choice)
DEFAULT_LOCK_STALE_SECONDS = 300.0
# Peers that are merely slow (importing torch from a loaded shared filesystem) must not be
# taken for dead ones: a dead local peer is noticed within seconds, a silent one only then.
DEFAULT_STARTUP_TIMEOUT = 600.0
_FALSE, _TRUE = ("0", "false", "no", "off"), ("1", "true", "yes", "on")
MAX_SECONDS = 366 * 24 * 3600.0
UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


@dataclass(frozen=True)
class FaultPoint:
    """``HPCKIT_FAULT=PHASE:RANK:N[:all]``: the N-th time RANK reaches PHASE it is killed."""

    phase: str
    rank: int
    occurrence: int
    whole_group: bool


text = str  # a variable's text, as given


def level(raw: str) -> str:
    level = raw.strip().upper()
    if level not in logging.getLevelNamesMapping():
        raise ValueError("a log level: DEBUG, INFO, WARNING or ERROR")
    return level


def count(raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):  # "²".isdigit() too, which int() refuses
        raise ValueError("a whole number >= 0")
    return int(text)


def seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_SECONDS:  # inf (or 1e400) overflows every timeout it reaches
        raise ValueError("a number of seconds > 0 and at most a year, e.g. 300")
    return value


def moment(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:
        raise ValueError("a time in seconds since 1970, as time.time() gives it")
    return value


def directory(raw: str) -> str:
    if not os.path.isdir(raw):
        raise ValueError("an existing directory (node-local disk, such as $TMPDIR); create it "
                         "first")
    return raw


def switch(raw: str) -> bool:
    text = raw.strip().lower()
    if text not in _FALSE + _TRUE:
        raise ValueError(f"one of {', '.join(_TRUE + _FALSE)}")
    return text in _TRUE


def parse_signal(raw: str) -> signal.Signals:
    """A signal by name (``USR2``, ``SIGUSR2``) or number, one that a process can catch."""
    name = raw.strip().upper()
    try:
        found = (signal.Signals(int(name)) if name.isdigit()
                 else signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except (KeyError, ValueError):
        raise ValueError("a signal name such as USR2, USR1 or TERM (match it to sbatch "
                         "--signal=USR2@120)") from None
    if found in UNCATCHABLE:
        raise ValueError("a signal a process can catch (not KILL or STOP), such as USR2, USR1 "
                         "or TERM (match it to sbatch --signal=USR2@120)")
    return found


def parse_fault(raw: str) -> FaultPoint:
    parts = raw.split(":")
    if (len(parts) not in (3, 4) or parts[0] not in FAULT_PHASES or not parts[1].isdigit()
            or not parts[2].isdigit() or int(parts[2]) < 1 or parts[3:] not in ([], ["all"])):
        raise ValueError(f"PHASE:RANK:N[:all] with PHASE one of {', '.join(FAULT_PHASES)}, e.g. "
                         "'written:1:2'; unset it outside hpckit's tests")
    return FaultPoint(parts[0], int(parts[1]), int(parts[2]), parts[3:] == ["all"])
