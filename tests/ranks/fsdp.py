"""A small MLP trained with ``prepare_model(parallel_strategy=...)`` and
``prepare_data_loader`` as a Ray 2.60 program writes them, its state saved and loaded with
DCP each epoch. FSDP2 and DDP see the same data in the same order, so they end with the same
parameters; a run resumed with another world size reshards. Rank 0 prints ``LOADER {json}``
(what the prepared loader kept), ``RESUMED {json}`` (the loaded parameters) and ``FINAL
{json}`` (the parameters at the end), each gathered whole."""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.utils.data import DataLoader, TensorDataset

import hpckit
from hpckit import CheckpointConfig, RunConfig, ScalingConfig
from hpckit.torch import (
    TorchTrainer,
    load_state_dcp,
    prepare_data_loader,
    prepare_model,
    save_state_dcp,
)


def data() -> TensorDataset:
    inputs = torch.linspace(-1, 1, 48 * 6).reshape(48, 6)
    return TensorDataset(inputs, inputs.sum(dim=1, keepdim=True).sin())


def whole(model: torch.nn.Module) -> list[float]:
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    return [round(float(v), 6) for key in sorted(state) for v in state[key].flatten()]


def train_loop(config: dict) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    kwargs = {"auto_wrap_policy": {torch.nn.Linear}} if config["strategy"] == "fsdp" else None
    model = prepare_model(model, move_to_device=True, parallel_strategy=config["strategy"],
                          parallel_strategy_kwargs=kwargs)
    generator = torch.Generator().manual_seed(7)
    loader = prepare_data_loader(
        DataLoader(data(), batch_size=4, shuffle=True, num_workers=1, prefetch_factor=3,
                   generator=generator, multiprocessing_context="fork"),
        add_dist_sampler=True, move_to_device=True, auto_transfer=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    first = 0
    if hpckit.get_checkpoint():
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state, "epoch": torch.tensor(-1)}
        load_state_dcp(state)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        first = int(state["epoch"]) + 1
        show("RESUMED", {"epoch": first - 1, "world": dist.get_world_size(),
                         "params": whole(model)})
    show("LOADER", {"generator": loader.generator is generator,
                    "prefetch_factor": loader.prefetch_factor,
                    "sampler": type(loader.sampler).__name__})
    for epoch in range(first, config["epochs"]):
        loader.sampler.set_epoch(epoch)  # as Ray asks; resumed runs shuffle as the first did
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
        model_state, optim_state = get_state_dict(model, optimizer)
        checkpoint = save_state_dcp({"model": model_state, "optim": optim_state,
                                     "epoch": torch.tensor(epoch)})
        hpckit.report({"epoch": epoch}, checkpoint=checkpoint)
    show("FINAL", {"params": whole(model), "model": type(model).__name__})


def show(tag: str, value: dict) -> None:
    if dist.get_rank() == 0:
        print(f"{tag} {json.dumps(value)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", required=True)
    p.add_argument("--name", default="fsdp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="fsdp")
    args = p.parse_args()
    from mpi4py import MPI

    TorchTrainer(train_loop, train_loop_config={"epochs": args.epochs, "strategy": args.strategy},
                 scaling_config=ScalingConfig(num_workers=MPI.COMM_WORLD.size),
                 run_config=RunConfig(name=args.name, storage_path=args.storage,
                                      checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()


if __name__ == "__main__":
    main()
