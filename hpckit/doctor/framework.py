"""The torch build, the time ``import torch`` takes, and the GPUs each rank sees; torch is
imported in a child process, so that the doctor itself never imports it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from hpckit.doctor.finding import FAIL, INFO, OK, WARN, Finding

SLOW_IMPORT_S = 30.0  # beyond this, a stop signal sent at start-up meets a long window
PROBE = """
import json, time
started = time.perf_counter()
import torch
took = time.perf_counter() - started
cuda = torch.version.cuda
print(json.dumps({"version": torch.__version__, "cuda": cuda, "import_s": took,
                  "devices": torch.cuda.device_count() if cuda else 0}))
"""


def look() -> dict[str, Any]:
    """What this rank's torch is, as a child process of this rank finds it."""
    seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
            "gpu_node": os.path.exists("/dev/nvidia0")}
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {**seen, "error": str(exc)}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {**seen, "error": last}
    return {**seen, **json.loads(out.stdout.strip().splitlines()[-1])}


def torch_build(per_rank: list[dict[str, Any]]) -> list[Finding]:
    failed = [(rank, p["error"]) for rank, p in enumerate(per_rank) if "error" in p]
    if failed:
        rank, error = failed[0]
        return [Finding("torch", FAIL, f"rank {rank}: import torch failed: {error}",
                        f"install torch into {sys.executable}'s environment (docs/site.md: a "
                        "site-built torch with python -m venv --system-site-packages)")]
    builds = {(p["version"], p["cuda"]) for p in per_rank}
    slowest = max(p["import_s"] for p in per_rank)
    found = "; ".join(f"{v} ({'CUDA ' + c if c else 'CPU only'})" for v, c in sorted(builds,
                                                                                   key=str))
    build = (Finding("torch", FAIL, f"ranks differ: {found}", "use one environment on every "
                     "node (the same venv or module)") if len(builds) > 1
             else Finding("torch", OK, found))
    timing = Finding("import torch", OK if slowest < SLOW_IMPORT_S else WARN,
                     f"{slowest:.1f} s on the slowest of {len(per_rank)} rank(s)",
                     "" if slowest < SLOW_IMPORT_S else "a slow shared filesystem: put the "
                     "environment on node-local disk or in a container image, and send the "
                     "stop signal earlier: @300 rather than @120 in #SBATCH --signal (the "
                     "Slurm signal check says which form fits the batch script)")
    return [build, timing]


def gpus(per_rank: list[dict[str, Any]]) -> Finding:
    """GPUs visible to each rank, and builds that cannot use the node's GPUs."""
    if any("error" in p for p in per_rank):
        return Finding("GPUs", INFO, "not checked: torch did not import")
    counts = [p["devices"] for p in per_rank]
    visible = {p["visible"] for p in per_rank}
    found = (f"{'/'.join(map(str, sorted(set(counts))))} per rank, CUDA_VISIBLE_DEVICES="
             + ", ".join(sorted(str(v) for v in visible)))
    if any(p["gpu_node"] and not p["cuda"] for p in per_rank):
        return Finding("GPUs", WARN, found + "; the node has NVIDIA GPUs, torch is a CPU build",
                       "install torch from its CUDA index (HPCKIT_TORCH_INDEX, .ci/install)")
    if any(p["gpu_node"] and p["cuda"] and not p["devices"] for p in per_rank):
        return Finding("GPUs", WARN, found + "; a rank on a GPU node sees none",
                       "check CUDA_VISIBLE_DEVICES and the job's --gpus-per-task / --gres")
    return Finding("GPUs", OK if any(counts) else INFO, found)


def nccl() -> Finding:
    """The NCCL settings in the environment (names and values: none of them is a secret)."""
    found = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("NCCL_"))
    return Finding("NCCL variables", INFO, ", ".join(found) if found else "none set")
