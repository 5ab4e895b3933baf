"""TorchConfig: the torch.distributed process group's back-end and timeout, as in Ray."""

from __future__ import annotations

from dataclasses import dataclass

from hpckit.errors import ConfigError

BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class TorchConfig:
    """How every rank joins the process group.

    ``backend`` None picks NCCL with ``ScalingConfig(use_gpu=True)`` and Gloo otherwise.
    ``init_method`` is accepted as Ray accepts it ("env" or "tcp"): hpckit's ranks always meet
    through a TCP store whose address rank 0 sends them over MPI. ``timeout_s`` bounds every
    collective of the process group.

    Args:
        backend: ``"nccl"`` or ``"gloo"``; None (the default) picks NCCL with
            ``ScalingConfig(use_gpu=True)`` and Gloo otherwise.
        init_method: ``"env"`` (the default) or ``"tcp"``, accepted for Ray's programs; the
            ranks meet through the same TCP store either way.
        timeout_s: Seconds (> 0, default 1800) after which a collective that has not
            completed fails, applied when the process group starts.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"TorchConfig(backend={self.backend!r}) must be None (NCCL on GPUs, "
                              f"Gloo on CPUs) or one of {', '.join(BACKENDS)}.")
        if self.init_method not in ("env", "tcp"):
            raise ConfigError(f"TorchConfig(init_method={self.init_method!r}) must be 'env' or "
                              "'tcp' (either way hpckit's ranks meet through a TCP store).")
        if (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float))
                or not self.timeout_s > 0):
            raise ConfigError(f"TorchConfig(timeout_s={self.timeout_s!r}) must be a number of "
                              "seconds > 0, e.g. 1800.")
