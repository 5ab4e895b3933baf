"""Whether a stop signal that comes while a rank starts (before ``import hpckit``) is kept:
the start-up hook in site-packages (``run/startup/hook.py``)."""

from __future__ import annotations

import os
import sys
import sysconfig

from hpckit.doctor.finding import INFO, OK, WARN, Finding

HOOK = "hpckit-early.pth"


def early_stop() -> Finding:
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)), "run", "startup", HOOK)
    if not getattr(sys, "hpckit_early_installed", False):
        return Finding("stop signal at start-up", WARN, f"{HOOK} is not in site-packages: a "
                       "stop signal before the script imports hpckit ends the rank",
                       f"reinstall hpckit with this Python (pip install -e . or pip install "
                       f"., which put it there), or cp {source} "
                       f"{sysconfig.get_paths()['purelib']}/")
    if os.environ.get("HPCKIT_EARLY_STOP", "1").lower() in ("0", "false", "no", "off"):
        return Finding("stop signal at start-up", INFO, "the hook is off (HPCKIT_EARLY_STOP=0)")
    active = getattr(sys, "hpckit_early_hook", None)
    return Finding("stop signal at start-up", OK, f"caught from the script's first line "
                   f"({active})" if active else "the hook is installed; it acts in ranks that "
                   "srun or mpiexec start")
