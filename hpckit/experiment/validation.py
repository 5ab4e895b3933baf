"""A checkpoint's validation as the manifest records it: what was asked (the function's
keyword arguments and time limit, so that a resumed run validates alike) and where it stands
(pending, validated with its metrics, failed or timed out, with the reason)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

PENDING, VALIDATED = "PENDING_VALIDATION", "VALIDATED"
FAILED, TIMED_OUT = "VALIDATION_FAILED", "VALIDATION_TIMEOUT"
STATUSES = (PENDING, VALIDATED, FAILED, TIMED_OUT)


@dataclass(frozen=True)
class Validation:
    status: str
    fn_kwargs: dict[str, Any]
    timeout_s: float | None = None
    metrics: dict[str, Any] | None = None  # what the validation function returned
    error: str | None = None  # why it failed or timed out

    @classmethod
    def asked(cls, task: dict[str, Any]) -> Validation:
        """Pending, with the arguments of ``ValidationConfig.task()``."""
        return cls(PENDING, dict(task["fn_kwargs"]), task["timeout_s"])

    @property
    def pending(self) -> bool:
        return self.status == PENDING

    def ended(self, status: str, metrics: dict[str, Any] | None = None,
              error: str | None = None) -> Validation:
        return replace(self, status=status, metrics=metrics, error=error)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def parse(raw: Any, where: str) -> Validation | None:
    """A manifest's ``validation`` field (None: none asked); raises ValueError naming what
    is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object")
    status, kwargs = raw.get("status"), raw.get("fn_kwargs", {})
    if status not in STATUSES:
        raise ValueError(f"{where}.status: {status!r} is none of {', '.join(STATUSES)}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"{where}.fn_kwargs: expected an object")
    timeout, metrics, error = raw.get("timeout_s"), raw.get("metrics"), raw.get("error")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise ValueError(f"{where}.timeout_s: expected a number")
    if metrics is not None and not isinstance(metrics, dict):
        raise ValueError(f"{where}.metrics: expected an object")
    if error is not None and not isinstance(error, str):
        raise ValueError(f"{where}.error: expected a string")
    return Validation(status, kwargs, timeout, metrics, error)
