"""The checks that need a GPU, as one short run on a lent machine (one GPU, one rank).

    python benchmarks/gpu_checks.py [--storage DIR] [--mib 1024]

1. ``save_state`` of ``--mib`` of CUDA tensors: the time ``save_state`` blocks (a copy into
   pinned staging memory; the file is written in the background) and the ``ASYNC``
   ``report()`` after it, beside the same run's baselines: a blocking ``torch.save`` of the
   same tensors to a file, and a plain copy of them to (pageable) host memory. Medians of
   4 repetitions, the first of which allocates the staging memory.
2. ``prepare_model(parallel_strategy="fsdp")``'s sharding on a GPU: a model made of
   ``fully_shard`` units over NCCL trains a step, its state goes through ``save_state_dcp``
   and ``load_state_dcp``, and the loaded parameters equal the saved ones.
3. Lightning's ``RayFSDPStrategy`` (Lightning's FSDP needs a GPU): a Trainer trains two
   epochs through ``RayTrainReportCallback``, and a second run resumes from the last
   checkpoint at the next epoch.
4. Each rank's own GPUs, in a process of its own per case: with CUDA_VISIBLE_DEVICES unset,
   set to the GPU's UUID, and in a script that started CUDA before ``fit()``: what the rank
   sees (its CUDA_VISIBLE_DEVICES, ``torch.cuda.device_count()``, its device's UUID), what
   Lightning's ``devices="auto"`` counts, and whether hpckit warned.

One JSON line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

import hpckit
from hpckit import Checkpoint, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer

CUDA_FIRST = "GPU_CHECKS_CUDA_FIRST"  # a script that starts CUDA as its ranks import it
if os.environ.get(CUDA_FIRST) == "1":
    torch.cuda.init()


def _ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 1)


def save_state_loop(config: dict[str, Any]) -> None:
    from hpckit.torch import save_state

    device = torch.device("cuda")
    tensors = {f"layer{i}": torch.randn(config["mib"] << 16, device=device) for i in range(4)}
    samples: dict[str, list[float]] = {"save_state": [], "report": [], "torch_save": [],
                                       "to_host": []}
    expected = []
    for rep in range(4):
        expected.append({k: float(v.double().sum()) for k, v in tensors.items()})
        torch.cuda.synchronize()
        started = time.perf_counter()
        checkpoint = save_state(tensors, "big.pt")
        samples["save_state"].append(time.perf_counter() - started)
        started = time.perf_counter()
        hpckit.report({"rep": rep}, checkpoint=checkpoint, checkpoint_upload_mode="async")
        samples["report"].append(time.perf_counter() - started)
        for t in tensors.values():
            t.add_(1.0)  # at once: the saved copy must not see it
        samples["torch_save"].append(_blocking_torch_save(tensors, config["scratch"]))
        torch.cuda.synchronize()
        started = time.perf_counter()
        host = {k: v.to("cpu") for k, v in tensors.items()}
        samples["to_host"].append(time.perf_counter() - started)
        del host
        time.sleep(2.0)  # training between checkpoints: the write ends in the background
    with open(os.path.join(config["scratch"], "expected.json"), "w") as f:
        json.dump(expected, f)
    print(json.dumps({"check": "save_state_gpu", "device": torch.cuda.get_device_name(),
                      "mib": config["mib"], "reps": 4,
                      **{f"{k}_ms": _ms(v) for k, v in samples.items()},
                      **{f"{k}_all_ms": [round(1000 * s, 1) for s in v]
                         for k, v in samples.items()},
                      "target_save_state_ms": 50}), flush=True)


def _blocking_torch_save(tensors: dict[str, torch.Tensor], scratch: str) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    path = os.path.join(scratch, "plain.pt")
    with open(path, "wb") as f:
        torch.save(tensors, f)
        f.flush()
        os.fsync(f.fileno())
    took = time.perf_counter() - started
    os.remove(path)
    return took


def fsdp_loop(config: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import FSDPModule

    from hpckit.integrations.torch.prepare import fully_sharded
    from hpckit.torch import load_state_dcp, save_state_dcp

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).to(device)
    # At world size 1 prepare_model leaves a model unwrapped, as Ray does: shard it directly.
    model = fully_sharded(model, device, {"auto_wrap_policy": {torch.nn.Linear}})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(32, 64, device=device)
    model(inputs).square().mean().backward()
    optimizer.step()
    saved = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    model_state, optim_state = get_state_dict(model, optimizer)
    hpckit.report({"step": 1}, checkpoint=save_state_dcp({"model": model_state,
                                                          "optim": optim_state}))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    load_state_dcp(state, Checkpoint.from_directory(
        os.path.join(hpckit.get_context().get_experiment_path(), "checkpoint_000000")))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    loaded = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    print(json.dumps({"check": "fsdp_gpu", "model": type(model).__name__,
                      "fsdp_module": isinstance(model, FSDPModule),
                      "backend": torch.distributed.get_backend(),
                      "loaded_equals_saved": all(torch.equal(saved[k], loaded[k])
                                                 for k in saved)}), flush=True)


def lightning_loop(config: dict[str, Any]) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from hpckit.lightning import (
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                           torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            inputs, targets = batch
            loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            # Lightning's FSDP cannot load a full checkpoint of a stateless optimizer (plain
            # SGD: IndexError in FSDPStrategy.load_checkpoint, Lightning 2.6.6).
            return torch.optim.Adam(self.parameters(), lr=0.01)

    inputs = torch.linspace(-1, 1, 256 * 8).reshape(256, 8)
    loader = DataLoader(TensorDataset(inputs, inputs.sum(1, keepdim=True).sin()), batch_size=32)
    trainer = prepare_trainer(pl.Trainer(
        max_epochs=config["epochs"], accelerator="gpu", devices=1,
        strategy=RayFSDPStrategy(), plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()], enable_checkpointing=False, logger=False,
        enable_progress_bar=False))
    checkpoint = hpckit.get_checkpoint()
    resume = None
    if checkpoint:
        with checkpoint.as_directory() as directory:
            resume = os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME)
    trainer.fit(Regression(), loader, ckpt_path=resume)
    print(json.dumps({"check": "lightning_fsdp_gpu", "epochs": config["epochs"],
                      "resumed_from": os.path.basename(os.path.dirname(resume)) if resume else None,
                      "current_epoch": trainer.current_epoch,
                      "global_step": trainer.global_step,
                      "strategy": type(trainer.strategy).__name__}), flush=True)


def devices_loop(config: dict[str, Any]) -> None:
    import lightning.pytorch as pl

    from hpckit.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
    from hpckit.torch import get_device

    trainer = prepare_trainer(pl.Trainer(
        accelerator="gpu", devices="auto", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False))
    print(json.dumps({"visible_in_rank": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "device_count": torch.cuda.device_count(), "device": str(get_device()),
                      "uuid": f"GPU-{torch.cuda.get_device_properties(get_device()).uuid}",
                      "lightning_auto_devices": trainer.num_devices}), flush=True)


def devices_case(case: str, storage: str) -> dict[str, Any]:
    """One case of check 4 in a process of its own (CUDA reads its device list once)."""
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()[0]
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if case == "uuid":
        env["CUDA_VISIBLE_DEVICES"] = uuid
    env[CUDA_FIRST] = "1" if case == "cuda_started" else "0"
    out = subprocess.run([sys.executable, __file__, "--devices-case", case, "--storage", storage],
                         env=env, capture_output=True, text=True, timeout=300)
    said = [line[line.index("{"):] for line in out.stdout.splitlines() if "visible_in_rank" in line]
    seen = json.loads(said[-1]) if out.returncode == 0 and said else {
        "failed": (out.stdout + out.stderr).strip().splitlines()[-3:]}
    return {"check": "devices_gpu", "case": case, "visible_before": env.get("CUDA_VISIBLE_DEVICES"),
            **seen, "own_gpu_uuid": seen.get("uuid") == uuid,
            "warned_cuda_started": "started CUDA before fit()" in out.stderr}


def fit(loop: Any, name: str, storage: str, config: dict[str, Any]) -> None:
    TorchTrainer(loop, train_loop_config={**config, "name": name},
                 scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                 run_config=RunConfig(name=name, storage_path=storage)).fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=None)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--devices-case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    storage = args.storage or tempfile.mkdtemp(prefix="hpckit-gpu-")
    if args.devices_case:
        return fit(devices_loop, f"devices_{args.devices_case}", storage, {})
    for case in ("unset", "uuid", "cuda_started"):
        print(json.dumps(devices_case(case, storage)), flush=True)
    checks = [("fsdp", fsdp_loop, {}), ("lightning", lightning_loop, {"epochs": 2}),
              ("lightning", lightning_loop, {"epochs": 4}),
              ("save_state", save_state_loop, {"mib": args.mib, "scratch": storage})]
    for name, loop, config in checks:
        try:
            fit(loop, name, storage, config)
        except Exception as exc:  # one failed check must not hide the others' figures
            print(json.dumps({"check": name, "failed": f"{type(exc).__name__}: {exc}"}),
                  flush=True)
    print(json.dumps({"check": "save_state_gpu_contents", **saved_as_reported(storage)}),
          flush=True)
    # Last: the checks run one rank in this process, which must not start CUDA before fit().
    print(json.dumps({"check": "machine", "torch": torch.__version__,
                      "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()}),
          flush=True)


def saved_as_reported(storage: str) -> dict[str, Any]:
    """Every committed ``big.pt`` holds the tensors as they were when ``save_state`` was
    called, not as the training changed them right after."""
    with open(os.path.join(storage, "expected.json")) as f:
        expected = json.load(f)
    found = {}
    for rep, sums in enumerate(expected):
        path = os.path.join(storage, "save_state", f"checkpoint_{rep:06d}", "big.pt")
        if os.path.exists(path):
            state = torch.load(path, map_location="cpu")
            found[rep] = all(abs(float(state[k].double().sum()) - v) <= 1e-6 * max(1, abs(v))
                             for k, v in sums.items())
    return {"checked": sorted(found), "all_equal": bool(found) and all(found.values())}


if __name__ == "__main__":
    main()
