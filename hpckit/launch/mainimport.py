"""Re-running the user's script in a rank the way multiprocessing's spawn does: the rank
imports the main file as ``__mp_main__`` (so ``if __name__ == "__main__":`` blocks do not
run) and stops that import at the script's own ``fit()`` call."""

from __future__ import annotations

import builtins
import sys
import types

importing_main = False


class MainImported(BaseException):
    """Raised by fit() while a spawned rank imports the user's script: stop the import there."""


def import_main(path: str) -> None:
    """Import the user's script as ``__mp_main__``, stopping at its call of fit()."""
    global importing_main
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    importing_main = True
    try:
        exec(code, module.__dict__)
    except MainImported:
        pass
    finally:
        importing_main = False
