"""TensorBoard scalars for every report, when the optional ``tensorboard`` package is there."""

from __future__ import annotations

import importlib.util
from typing import Any

from hpckit._log import log
from hpckit._uri import Location

DIRECTORY = "tensorboard"


def _installed() -> bool:
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as none
        return False


class Scalars:
    """Writes rank 0's numeric metrics as scalar events under ``{experiment}/tensorboard``."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    @classmethod
    def open(cls, experiment: Location) -> Scalars | None:
        if not _installed():
            return None
        if not experiment.is_local:
            log.info("TensorBoard events are written for local storage only; %s is remote",
                     experiment.display)
            return None
        from torch.utils.tensorboard import SummaryWriter

        return cls(SummaryWriter(log_dir=experiment.join(DIRECTORY).path))

    def add(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        for key, value in metrics.items():
            if isinstance(value, dict):
                self.add(step, value, f"{prefix}{key}/")
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{prefix}{key}", value, step)
        if not prefix:
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
