"""What one check found: a value, never mutated, that crosses MPI and becomes a table row."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OK, INFO, WARN, FAIL = "ok", "info", "warn", "FAIL"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # OK, INFO, WARN or FAIL
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def worst(findings: list[Finding]) -> str:
    """The most serious status among ``findings``."""
    order = (OK, INFO, WARN, FAIL)
    return max((f.status for f in findings), key=order.index, default=OK)
