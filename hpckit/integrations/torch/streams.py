"""torch's random streams as a keeper of :mod:`hpckit.run.session.resumable`: the CPU
generator, and each CUDA device's where this process has started CUDA (asking would start
it on every visible device). ``TorchTrainer``'s back-end has them kept, with Python's and
NumPy's (``keepers``)."""

from __future__ import annotations

from typing import Any

import torch

from hpckit.run.session import resumable


class TorchRandom:
    def state_dict(self) -> dict[str, Any]:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return {"cpu": torch.get_rng_state(), "cuda": cuda}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        cuda = state["cuda"]
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def keepers() -> dict[str, Any]:
    """The random streams a torch run keeps with each checkpoint: Python's, NumPy's, torch's."""
    return {"random": resumable.PythonRandom(), "torch": TorchRandom()}


def snapshot() -> list[Any]:
    """The process's random streams now."""
    return [keeper.state_dict() for keeper in keepers().values()]


def put_back(states: list[Any]) -> None:
    """The process's random streams as ``snapshot()`` found them."""
    for keeper, state in zip(keepers().values(), states, strict=True):
        keeper.load_state_dict(state)
