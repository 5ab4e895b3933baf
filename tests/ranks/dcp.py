"""Sharded state saved with torch DCP into the pending checkpoint and committed by report():
a DTensor sharded over every rank plus a replicated step counter. A run resumed with another
world size loads it resharded. Rank 0 prints ``FINAL {json}`` with the full tensor's sum."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from concurrent import futures

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import hpckit
from hpckit import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from hpckit.torch import TorchTrainer, load_state_dcp, save_state_dcp

ROWS, COLS = 12, 4096


def train_loop(config: dict) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    weights = distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)])
    state = {"weights": weights, "epoch": torch.tensor(-1)}
    if hpckit.get_checkpoint():
        load_state_dcp(state)
        print(f"RESUMED epoch={int(state['epoch'])} world={dist.get_world_size()}", flush=True)
    for epoch in range(int(state["epoch"]) + 1, config["epochs"]):
        with torch.no_grad():
            weights.add_(float(epoch + 1))
        state["epoch"] = torch.tensor(epoch)
        metrics = {"epoch": epoch, "sum": float(weights.full_tensor().sum())}
        mode = "async" if config["async"] else "sync"
        if config["upload"] and config["async"]:
            _report_uploaded_async(state, metrics, epoch)
            continue
        if config["upload"]:
            with tempfile.TemporaryDirectory() as d:  # the local checkpoint Ray would upload
                hpckit.report(metrics, checkpoint=Checkpoint.from_directory(d),
                              checkpoint_upload_mode=mode,
                              checkpoint_upload_fn=_uploading(state, config["upload"]))
            continue
        checkpoint = save_state_dcp(state, async_=config["async"])
        hpckit.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=mode)
    total = float(weights.full_tensor().sum())
    if dist.get_rank() == 0:
        print("FINAL " + json.dumps({"sum": total, "epoch": int(state["epoch"])}), flush=True)


def _uploading(state: dict, where: str):
    """report(checkpoint_upload_fn=...), SYNC: DCP's save straight into the experiment's
    checkpoint directory, inside report() (``where="outside"``: into a directory of its own,
    which hpckit refuses)."""
    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        directory = os.path.join(hpckit.get_context().get_experiment_path(), checkpoint_dir_name)
        if where == "outside":
            directory = tempfile.mkdtemp(prefix="elsewhere-", dir=os.path.dirname(
                hpckit.get_context().get_experiment_path()))  # beside the experiment
        dcp.async_save(state, checkpoint_id=directory).result()
        return Checkpoint.from_directory(directory)
    return upload


_group = None
_saving = None


def _report_uploaded_async(state: dict, metrics: dict, epoch: int) -> None:
    """report(checkpoint_upload_fn=..., ASYNC), as Ray's guide has it: DCP's async_save
    starts now, on a Gloo group of its own, into the directory named by checkpoint_dir_name;
    the upload function, run on hpckit's background thread, waits for it."""
    global _group, _saving
    if _group is None:
        _group = dist.new_group(backend="gloo")
    if _saving is not None:  # one save at a time on the group (its upload's outcome is hpckit's)
        futures.wait([_saving])
    name = f"dcp-epoch-{epoch}"
    directory = os.path.join(hpckit.get_context().get_experiment_path(), name)
    saving = _saving = dcp.async_save(state, checkpoint_id=directory, process_group=_group)

    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        assert checkpoint_dir_name == name, checkpoint_dir_name
        saving.result()
        return Checkpoint.from_directory(directory)

    hpckit.report(metrics, checkpoint=Checkpoint(directory), checkpoint_dir_name=name,
                  checkpoint_upload_mode="async", checkpoint_upload_fn=upload)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--async", dest="async_", action="store_true")
    p.add_argument("--upload", choices=["dcp", "outside"], default=None,
                   help="checkpoint with report(checkpoint_upload_fn=...)")
    args = p.parse_args()
    from mpi4py import MPI

    TorchTrainer(train_loop, train_loop_config={"epochs": args.epochs, "async": args.async_,
                                                   "upload": args.upload},
                 scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                 run_config=RunConfig(name="dcp", storage_path=args.storage,
                                      checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()


if __name__ == "__main__":
    main()
