"""prepare_model(parallel_strategy="fsdp"), FSDP2 on CPU ranks with Gloo, as a Ray 2.60
program writes it: it trains to the parameters DDP reaches on the same data, its sharded
state goes through DCP, and a run resumed with another world size reshards it."""

from __future__ import annotations

import json

from conftest import HERE, mpiexec

FSDP = HERE / "ranks" / "fsdp.py"


def _values(run, tag: str) -> dict:
    line = run.line(tag)
    assert line is not None, run.output
    return json.loads(line)


def test_fsdp_trains_to_what_ddp_reaches_and_the_loader_keeps_its_arguments(tmp_path):
    fsdp = mpiexec(3, "--storage", str(tmp_path), "--name", "f", "--strategy", "fsdp",
                   script=FSDP, timeout=180)
    ddp = mpiexec(3, "--storage", str(tmp_path), "--name", "d", "--strategy", "ddp",
                  script=FSDP, timeout=180)
    assert _values(fsdp, "FINAL")["model"] == "FSDPSequential"
    assert _values(ddp, "FINAL")["model"] == "DistributedDataParallel"
    sharded, replicated = _values(fsdp, "FINAL")["params"], _values(ddp, "FINAL")["params"]
    assert len(sharded) == 6 * 16 + 16 + 16 + 1
    assert max(abs(a - b) for a, b in zip(sharded, replicated)) < 1e-4, (sharded, replicated)
    assert _values(fsdp, "LOADER") == {"generator": True, "prefetch_factor": 3,
                                       "sampler": "DistributedSampler"}


def test_fsdp_state_resumes_resharded_to_another_world_size(tmp_path):
    first = mpiexec(2, "--storage", str(tmp_path), "--epochs", "2", script=FSDP, timeout=180)
    saved = _values(first, "FINAL")["params"]
    resumed = mpiexec(3, "--storage", str(tmp_path), "--epochs", "4", script=FSDP, timeout=180)
    loaded = _values(resumed, "RESUMED")
    assert loaded["epoch"] == 1 and loaded["world"] == 3 and loaded["params"] == saved
    assert _values(resumed, "FINAL")["params"] != saved
