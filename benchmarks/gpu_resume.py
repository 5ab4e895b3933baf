"""Exact resume's checks that need a GPU (#52), as one short run on a lent machine.

    python benchmarks/gpu_resume.py [--storage DIR]

1. ``cuda_streams``: torch's random streams as a rank keeps them (``TorchRandom``: the CPU
   generator and each CUDA device's), taken, then dropout masks drawn on the GPU, the
   streams put back and the masks drawn again: the same masks.
2. ``exact_resume_gpu``: ``tests/ranks/exact.py --gpu`` on one rank (``use_gpu=True``, NCCL,
   dropout on the GPU) under ``hpckit run --max-failures 2``, the rank SIGKILLed at steps 12
   and 17 and restarted from the mid-epoch checkpoints, against the same run uninterrupted:
   the final parameters, byte for byte.
3. ``resume_state``: ``benchmarks/resume_state.py`` with CUDA started: what taking a rank's
   state costs per checkpoint, with the CUDA device's stream in it.

One JSON line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
EXACT = ROOT / "tests" / "ranks" / "exact.py"


def cuda_streams() -> dict[str, object]:
    from hpckit.integrations.torch.loader import TorchRandom

    torch.cuda.init()
    keeper = TorchRandom()
    saved = keeper.state_dict()
    dropout = torch.nn.Dropout(0.5)
    first = dropout(torch.ones(4096, device="cuda"))
    keeper.load_state_dict(saved)
    again = dropout(torch.ones(4096, device="cuda"))
    return {"check": "cuda_streams", "devices": len(saved["cuda"] or []),
            "same_masks": bool(torch.equal(first, again))}


def final_params(storage: str, name: str, *kills: str) -> tuple[list[str], str]:
    markers = tempfile.mkdtemp(dir=storage)
    command = [sys.executable, "-m", "hpckit", "run", "-n", "1", "--max-failures", "2",
               str(EXACT), "--storage", storage, "--name", name, "--workers", "1", "--gpu",
               "--markers", markers, *(arg for kill in kills for arg in ("--kill", kill))]
    out = subprocess.run(command, capture_output=True, text=True, timeout=400,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    found = re.search(r"FINAL (\{[^{}]*\})", out.stdout + out.stderr)
    if found is None:
        raise SystemExit(f"exact.py did not finish:\n{out.stdout}\n{out.stderr}")
    return json.loads(found.group(1))["params"], out.stdout + out.stderr


def exact_resume_gpu(storage: str) -> dict[str, object]:
    reference, _ = final_params(storage, "uninterrupted")
    killed, output = final_params(storage, "killed", "0:12", "0:17")
    resumed = re.findall(r"resuming experiment \S+ from (checkpoint_\d+)", output)
    return {"check": "exact_resume_gpu", "resumed_from": resumed,
            "bit_identical": killed == reference, "device": torch.cuda.get_device_name()}


def resume_state(storage: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "resume_state.py"),
                          "--storage", storage], capture_output=True, text=True, timeout=300,
                         check=True)
    line = json.loads(out.stdout.strip().splitlines()[-1])
    return {**line, "check": "resume_state", "device": torch.cuda.get_device_name()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=None)
    args = parser.parse_args()
    storage = tempfile.mkdtemp(prefix="gpu-resume-", dir=args.storage)
    print(json.dumps(cuda_streams()), flush=True)
    print(json.dumps(exact_resume_gpu(storage)), flush=True)
    print(json.dumps(resume_state(storage)), flush=True)


if __name__ == "__main__":
    main()
