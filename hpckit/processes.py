"""Processes of this host, read from /proc: liveness, parents, siblings (ground layer)."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass


def alive(pid: int) -> bool:
    """Whether a process of this host still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    found = stat(pid)  # a killed rank whose parent died first stays a zombie until reaped
    return found is None or found.state != "Z"


@dataclass(frozen=True)
class Stat:
    pid: int
    name: str
    state: str
    parent: int
    started: int  # clock ticks after boot: with the pid, it names one process for good


def stat(pid: int) -> Stat | None:
    """The process's name, state, parent and start time; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return Stat(pid, name, fields[0], int(fields[1]), int(fields[19]))


def ancestor(name: str, most: int = 12) -> Stat | None:
    """The nearest ancestor of this process called ``name`` (e.g. slurmstepd)."""
    current = stat(os.getpid())
    for _ in range(most):
        if current is None or current.parent <= 1:
            return None
        current = stat(current.parent)
        if current is not None and current.name == name:
            return current
    return None


def children(parent: int) -> list[Stat]:
    """The live (not zombie) children of ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = stat(int(entry))
            if child is not None and child.parent == parent and child.state != "Z":
                found.append(child)
    return found


def environment_value(pid: int, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` set in another process's environment (our own user's only)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return None
    for name in names:
        if name.encode() in entries:
            return entries[name.encode()].decode(errors="replace")
    return None


def started_at(pid: int | None = None) -> float | None:
    """When a process of this host started, in seconds since the epoch (None off Linux)."""
    found = stat(pid or os.getpid())
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if found is None:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return time.time() - (uptime - found.started / ticks)


def background_thread() -> None:
    """Let the calling thread (and the threads it starts) run only on a core that training
    leaves idle: Linux's SCHED_IDLE. A checkpoint's background copy, hash and fsync then
    stop competing with compute-bound ranks for the CPU; when no core is ever idle they still
    finish, since report() waits for them once too many are in flight (training's threads
    then block, and the core is free). Elsewhere (no SCHED_IDLE) this does nothing."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        return
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        pass


PR_SET_PDEATHSIG = 1


def ended_with(parent: int, signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child process (Linux): ``signum`` when ``parent`` dies, however
    it dies (SIGKILL, the out-of-memory killer). For the launcher of the ranks, a stop
    request it passes on (without it, ranks whose driver was killed trained on, holding the
    lock); for a validation process, its end."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:  # runs in the child between fork and exec: no logging, no locks
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # died before the request was made
            os.kill(os.getpid(), signum)

    return arm
