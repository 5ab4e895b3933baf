"""The public face of an optional integration (``hpckit.lightning``, ``hpckit.transformers``):
each name imported when first used, and a missing extra named with its install command."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from hpckit.errors import hpckit_clone


def lazy_names(face: str, integration: str, names: list[str], extra: str,
               packages: tuple[str, ...]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for module ``face``, whose public ``names`` live in the
    module ``integration``; ``packages`` are those that the extra ``extra`` brings."""

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(integration)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] not in packages:
                raise
            raise ModuleNotFoundError(f"{face}.{name} needs {exc.name.split('.')[0]}, which is "
                                      f"not installed: {install_command(extra)}",
                                      name=exc.name) from None
        value = getattr(module, name)
        setattr(sys.modules[face], name, value)
        return value

    def dir_() -> list[str]:
        return sorted([*vars(sys.modules[face]), *names])

    return getattr_, dir_


def install_command(extra: str) -> str:
    """How to add ``extra``. hpckit is not on PyPI: it is installed from a clone, named by its
    path when this hpckit runs from one (an editable install)."""
    clone = hpckit_clone()
    if clone:
        return f"pip install -e '{clone}[{extra}]'"
    return f"pip install -e '.[{extra}]' in the clone of hpckit that you installed it from"
