"""Re-running the user's script in a rank the way multiprocessing's spawn does: the rank
imports the main file as ``__mp_main__`` (so ``if __name__ == "__main__":`` blocks do not
run) and stops that import at the script's own ``fit()`` call."""

from __future__ import annotations

import builtins
import json
import os
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


def not_at_top_level(name: str, path: str) -> str:
    """What a rank says when unpickling its job needs ``name`` from the script, which the
    script's import did not define: it lies under the main guard (or is made at run time)."""
    return (f"the ranks cannot find {name} in {path}: each rank imports the script as a module, "
            f"where its `if __name__ == \"__main__\":` block does not run, and {name} is not "
            f"defined at its top level. Define {name} at module level, outside that block, and "
            "keep only the fit() call inside it.")


def enter(payload: str) -> None:
    """In a rank that hpckit started: the launching process's path, arguments and directory,
    then its script imported (``main.json`` in ``payload``)."""
    with open(os.path.join(payload, "main.json")) as f:
        spec = json.load(f)
    sys.path[:] = spec["sys_path"]
    sys.argv[:] = spec["argv"]
    os.chdir(spec["cwd"])
    import_main(spec["main"])
