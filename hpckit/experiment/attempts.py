"""Attempts: one record per start of a run, with a typed status, as the manifest keeps them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from hpckit.errors import ManifestError
from hpckit.experiment.values import flatten
from hpckit.settings import Settings


class AttemptStatus(StrEnum):
    """How an attempt ended (``running`` while it has not)."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    REQUEUED = "requeued"
    STOPPED = "stopped"
    HUNG = "hung"


@dataclass(frozen=True)
class Attempt:
    """One start of a run: who ran it, where, how, and how it ended."""

    attempt: int
    status: AttemptStatus
    started_at: float = 0.0
    world_size: int | None = None
    launcher: str | None = None
    host: str | None = None
    pid: int | None = None
    argv: tuple[str, ...] = ()
    slurm: dict[str, str] = field(default_factory=dict)
    ended_at: float | None = None
    error: str | None = None
    reports: int | None = None
    # The run's configuration, recorded only when it differs from the attempt before.
    config: dict[str, Any] | None = None
    # The checkpoint it resumed from (None: it started from the experiment's beginning).
    resumed_from: str | None = None

    def ended(self, status: AttemptStatus, error: str | None = None,
              reports: int | None = None) -> Attempt:
        return replace(self, status=status, ended_at=time.time(), error=error,
                       reports=reports if reports is not None else self.reports)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"attempt": self.attempt, "status": self.status.value,
                                "started_at": self.started_at, "world_size": self.world_size,
                                "launcher": self.launcher, "host": self.host, "pid": self.pid,
                                "argv": list(self.argv), "slurm": dict(self.slurm)}
        for key in ("ended_at", "error", "reports", "config", "resumed_from"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        return body

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Attempt:
        if not isinstance(raw, dict):
            raise ManifestError(f"manifest {where}: an attempt is not an object: {raw!r}.")
        try:
            status = AttemptStatus(raw.get("status", "running"))
        except ValueError:
            raise ManifestError(f"manifest {where}: attempt status {raw.get('status')!r} is none "
                                f"of {', '.join(s.value for s in AttemptStatus)}.") from None
        known = {k: raw[k] for k in ("attempt", "started_at", "world_size", "launcher", "host",
                                     "pid", "ended_at", "error", "reports", "config",
                                     "resumed_from") if k in raw}
        known.setdefault("attempt", 0)
        return cls(status=status, argv=tuple(raw.get("argv") or ()),
                   slurm=dict(raw.get("slurm") or {}), **known)

    @property
    def duration(self) -> float | None:
        return self.ended_at - self.started_at if self.ended_at is not None else None


def config_changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What changed from ``before`` to ``after``, one ``key: old -> new`` per leaf; nested
    keys are joined with dots (``train_loop_config.epochs: 5 -> 8``)."""
    if before is None:
        return []
    old, new = flatten(before, "."), flatten(after, ".")
    return [f"{key}: {_short(old.get(key))} -> {_short(new.get(key))}"
            for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key)]


def effective_configs(attempts: tuple[Attempt, ...]) -> list[dict[str, Any] | None]:
    """Each attempt's configuration: its own, or that of the last attempt that recorded one."""
    current: dict[str, Any] | None = None
    configs = []
    for attempt in attempts:
        current = attempt.config if attempt.config is not None else current
        configs.append(current)
    return configs


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def previous_failure(settings: Settings) -> tuple[AttemptStatus, str, frozenset[int]] | None:
    """How the attempt before this one ended, where its launcher (``hpckit run``) restarted
    its ranks after seeing them fail or hang, with their PIDs (none where srun started them:
    then it is the attempt left running that failed so)."""
    if not settings.previous_failure:
        return None
    pids = frozenset(int(p) for p in (settings.previous_pids or "").split(",") if p.isdigit())
    status = AttemptStatus.HUNG if settings.previous_hung else AttemptStatus.FAILED
    return status, settings.previous_failure, pids
