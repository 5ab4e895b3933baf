"""The virtualenv that Ray Train's side of the comparisons runs in, made on first use.

Ray Train 2.60 and the same torch as hpckit's own environment (2.13.0), nothing of hpckit:
the workload imports Ray's modules there (``benchmarks/workload.py --framework ray``).
``HPCKIT_BENCH_RAY_VENV`` names another place for it; the default is kept under
``~/.cache`` so that later runs reuse it.
"""

from __future__ import annotations

import os
import subprocess
import sys

RAY_VERSION = "2.60.0"
TORCH_VERSION = "2.13.0"
DEFAULT = os.path.join(os.path.expanduser("~"), ".cache", "hpckit-bench", f"ray-{RAY_VERSION}")


def ray_python() -> str:
    """The interpreter of a virtualenv with Ray Train installed, made if it is not there yet."""
    venv = os.environ.get("HPCKIT_BENCH_RAY_VENV", DEFAULT)
    python = os.path.join(venv, "bin", "python")
    if not _has_ray(python):
        print(f"making {venv} with ray[train]=={RAY_VERSION} (a minute or two)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}",
                        f"ray[train]=={RAY_VERSION}"], check=True)
    return python


def _has_ray(python: str) -> bool:
    if not os.path.exists(python):
        return False
    probe = subprocess.run([python, "-c", "import ray; print(ray.__version__)"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == RAY_VERSION
