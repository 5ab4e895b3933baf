"""prepare_model and prepare_data_loader, with Ray 2.60's signatures: DDP or FSDP2 for the
model, and a loader that gives each rank its share and moves batches to the device.

FSDP2 for ``prepare_model(parallel_strategy="fsdp")``: the model's parameters sharded
across the ranks with ``torch.distributed.fsdp.fully_shard``, on GPUs (NCCL) and on CPUs
(Gloo) alike. Save and resume its sharded state with DCP (``save_state_dcp``).

``enable_reproducibility``: the same numbers from the same seed, as in Ray.
"""

from __future__ import annotations

import os
import random
import signal
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)
from torchdata.stateful_dataloader import StatefulDataLoader

from hpckit.errors import ConfigError
from hpckit.integrations.torch import distributed as _distributed
from hpckit.integrations.torch.loader import PreparedLoader
from hpckit.run.session.session import keep_loader

PARALLEL_STRATEGIES = ("ddp", "fsdp", None)


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def prepare_model(model: torch.nn.Module, move_to_device: bool | torch.device = True,
                  parallel_strategy: str | None = "ddp",
                  parallel_strategy_kwargs: dict[str, Any] | None = None,
                  **ddp_kwargs: Any) -> torch.nn.Module:
    """Move ``model`` to this rank's device (or to ``move_to_device`` where it is a device)
    and, at world size > 1, wrap it in ``DistributedDataParallel`` (``"ddp"``), shard it
    with FSDP2's ``fully_shard`` (``"fsdp"``), or neither (``None``).

    ``parallel_strategy_kwargs`` go to DDP, or to ``fully_shard`` for every sharded module
    (see :func:`fully_sharded`). Keywords beyond Ray's
    are DDP's, as in earlier hpckit releases.

    Ray wraps in FSDP1's ``FullyShardedDataParallel`` on GPUs only; hpckit shards with
    FSDP2, on GPUs and on CPUs (Gloo). Save and resume sharded state with
    ``save_state_dcp``/``load_state_dcp``.

    Args:
        model: The model to prepare.
        move_to_device: True (the default) moves the model to this rank's device
            (``get_device()``); a ``torch.device`` moves it there; False leaves it where it
            is.
        parallel_strategy: ``"ddp"`` (the default), ``"fsdp"`` or None (no wrapper). At
            world size 1 the model is not wrapped.
        parallel_strategy_kwargs: Keywords for ``DistributedDataParallel``, or for
            ``fully_shard`` plus ``auto_wrap_policy`` (module classes, or a function of a
            module) with ``"fsdp"``; FSDP1's keywords are an error naming FSDP2's. None (the
            default): none. On a GPU, DDP gets ``device_ids`` and ``output_device`` unless
            given.
        **ddp_kwargs: More keywords for ``DistributedDataParallel`` (with ``"ddp"`` only);
            they win over ``parallel_strategy_kwargs``.

    Returns:
        The model, moved and wrapped.

    Raises:
        ConfigError: ``parallel_strategy`` is none of these, DDP's keywords are given with
            another strategy, or ``fully_shard`` is given FSDP1's keywords.
    """
    if parallel_strategy not in PARALLEL_STRATEGIES:
        raise ConfigError(f"prepare_model(parallel_strategy={parallel_strategy!r}): give "
                          "'ddp', 'fsdp' or None, as in Ray.")
    if ddp_kwargs and parallel_strategy != "ddp":
        raise ConfigError(f"prepare_model(): {sorted(ddp_kwargs)} are DDP's keywords, but "
                          f"parallel_strategy={parallel_strategy!r}; pass the strategy's own "
                          "in parallel_strategy_kwargs.")
    kwargs = {**(parallel_strategy_kwargs or {}), **ddp_kwargs}
    device = (move_to_device if isinstance(move_to_device, torch.device)
              else _distributed.device())
    if move_to_device is not False:
        model = model.to(device)
    if _world_size() == 1 or parallel_strategy is None:
        return model
    if parallel_strategy == "fsdp":
        return fully_sharded(model, device, kwargs)
    if device.type == "cuda":
        kwargs = {"device_ids": [device.index], "output_device": device.index, **kwargs}
    return torch.nn.parallel.DistributedDataParallel(model, **kwargs)


def prepare_data_loader(loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True, auto_transfer: bool = True) -> Any:
    """Give each rank its own share of ``loader``'s dataset, move batches to the device, and
    keep the loader's position with every checkpoint for an exact resume.

    A ``DataLoader`` is rebuilt as torchdata's ``StatefulDataLoader``, keeping every argument
    it was given (its generator, prefetch factor, pin-memory device and the rest); at world
    size > 1 around a ``DistributedSampler`` (shuffling as the loader did), unless its
    dataset is an ``IterableDataset``, it already has a ``DistributedSampler``, or
    ``add_dist_sampler=False``. A subclass of ``DataLoader`` is kept as it is. The sampler's
    epoch advances each time the loader is iterated, unless you set it yourself
    (``loader.sampler.set_epoch(epoch)``, as Ray asks), which then wins. A resumed run's
    first ``get_checkpoint()`` puts the loader back where it was when the checkpoint was
    reported: the next pass continues the cut one (``CheckpointConfig(exact_resume=...)``).
    ``auto_transfer`` is accepted for Ray's signature: batches move with non-blocking copies
    to a GPU either way. The loader's worker processes ignore SIGTERM: Slurm sends it to
    every process of the job step when it preempts the job, and the rank stops at its next
    report (the workers end with it), where a worker would die at once.

    Args:
        loader: The ``DataLoader`` to prepare.
        add_dist_sampler: At world size > 1, give each rank its share of the dataset through
            a ``DistributedSampler`` (True, the default); False keeps the loader's sampler,
            which then gives every rank the whole dataset unless it shards itself.
        move_to_device: Move each batch's tensors to this rank's device (True, the default);
            False leaves them on the CPU.
        auto_transfer: Accepted for Ray's signature; batches go to a GPU with non-blocking
            copies either way.

    Returns:
        A loader that iterates as ``loader`` did, over this rank's share, and whose position
        every checkpoint keeps.
    """
    if not isinstance(loader.worker_init_fn, _IgnoringTerm):
        loader.worker_init_fn = _IgnoringTerm(loader.worker_init_fn)
    sampler = loader.sampler
    if (add_dist_sampler and _world_size() > 1 and not isinstance(sampler, DistributedSampler)
            and not isinstance(loader.dataset, IterableDataset)):
        sampler = DistributedSampler(loader.dataset,
                                     shuffle=not isinstance(sampler, SequentialSampler))
        loader = stateful(loader, sampler)
    elif type(loader) is DataLoader:
        loader = stateful(loader, sampler)
    prepared = PreparedLoader(loader, _distributed.device() if move_to_device else None)
    prepared.name = keep_loader(prepared)
    return prepared


def stateful(loader: DataLoader, sampler: Any) -> StatefulDataLoader:
    """``loader`` again as a ``StatefulDataLoader`` over ``sampler``: every other argument
    kept. A plain shuffling or sequential sampler becomes torchdata's own, whose position
    is kept without reading the batches before it."""
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in 2.13
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return _stateful(loader, sampler)


def _stateful(loader: DataLoader, sampler: Any) -> StatefulDataLoader:
    kept = {name: getattr(loader, name) for name in (
        "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
        "multiprocessing_context", "generator", "persistent_workers", "pin_memory_device",
        "in_order") if hasattr(loader, name)}
    if loader.num_workers > 0:
        kept["prefetch_factor"] = loader.prefetch_factor
    if loader.batch_size is None and loader.batch_sampler is not None:  # the user's batch sampler
        return StatefulDataLoader(loader.dataset, batch_sampler=loader.batch_sampler, **kept)
    if isinstance(loader.dataset, IterableDataset):
        return StatefulDataLoader(loader.dataset, batch_size=loader.batch_size,
                                  drop_last=loader.drop_last, **kept)
    if type(sampler) in (SequentialSampler, RandomSampler) and not _resampling(sampler):
        return StatefulDataLoader(loader.dataset, batch_size=loader.batch_size,
                                  drop_last=loader.drop_last,
                                  shuffle=type(sampler) is RandomSampler, **kept)
    return StatefulDataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                              drop_last=loader.drop_last, **kept)


def _resampling(sampler: Any) -> bool:
    """A RandomSampler that draws with replacement or a number of its own."""
    return bool(getattr(sampler, "replacement", False)) or getattr(sampler, "_num_samples", None) is not None


class _IgnoringTerm:
    """A DataLoader's ``worker_init_fn`` that first sets SIGTERM aside (picklable, for the
    spawn start method)."""

    def __init__(self, init: Callable[[int], None] | None) -> None:
        self.init = init

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.init is not None:
            self.init(worker_id)


# FSDP1's keywords (Ray wraps in FullyShardedDataParallel), and what FSDP2 takes instead.
FSDP1_KEYWORDS = {
    "sharding_strategy": "reshard_after_forward=True (FULL_SHARD) or False (SHARD_GRAD_OP)",
    "mixed_precision": "mp_policy=torch.distributed.fsdp.MixedPrecisionPolicy(...)",
    "cpu_offload": "offload_policy=torch.distributed.fsdp.CPUOffloadPolicy()",
    "device_id": "mesh=init_device_mesh(...) (hpckit makes one over every rank)",
    "use_orig_params": "nothing: FSDP2 always keeps the original parameters",
    "backward_prefetch": "nothing: FSDP2 prefetches by itself",
    "sync_module_states": "nothing: build the model with the same seed on every rank",
}


def fully_sharded(model: torch.nn.Module, device: torch.device,
                  options: dict[str, Any]) -> torch.nn.Module:
    """``model`` sharded in place: each module that ``options["auto_wrap_policy"]`` picks
    (a module class, a collection of classes as Lightning takes, or a function of a module
    returning bool) becomes a unit of its own, then the whole model; the other options go
    to every ``fully_shard`` call. Returns the model, now an ``FSDPModule``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    options = dict(options)
    wrong = sorted(set(options) & set(FSDP1_KEYWORDS))
    if wrong:
        raise ConfigError(
            f"prepare_model(parallel_strategy='fsdp') shards with FSDP2's fully_shard, which "
            f"does not take FSDP1's {wrong}; give " +
            "; ".join(f"{k}: {FSDP1_KEYWORDS[k]}" for k in wrong) + ".")
    picks = _policy(options.pop("auto_wrap_policy", None))
    options.setdefault("mesh", init_device_mesh(device.type, (dist.get_world_size(),)))
    for module in reversed(list(model.modules())):  # the innermost first, as FSDP2 asks
        if module is not model and picks(module):
            fully_shard(module, **options)
    fully_shard(model, **options)  # in place: the model's class becomes FSDP's subclass
    return model


def _policy(policy: Any) -> Callable[[torch.nn.Module], bool]:
    if policy is None:
        return lambda module: False
    if isinstance(policy, type):
        policy = (policy,)
    if isinstance(policy, (set, frozenset, list, tuple)):
        classes = tuple(policy)
        return lambda module: isinstance(module, classes)
    if callable(policy):
        return lambda module: bool(policy(module))
    raise ConfigError(f"prepare_model(): auto_wrap_policy={policy!r}; give a module class, a "
                      "set of them, or a function of a module returning True to shard it.")


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, NumPy and torch with ``seed`` and make torch choose deterministic
    algorithms (cuDNN without benchmarking, cuBLAS with a fixed workspace). Call it at the
    start of the training function, on every rank. Deterministic kernels can be slower, and
    an operation that has none then raises.

    Data loaders are not seeded here (Ray's ``prepare_data_loader`` seeds their workers):
    give yours a ``generator``, which ``prepare_data_loader`` keeps.

    Args:
        seed: The seed for Python's ``random``, NumPy's global generator and torch (default
            0); the same on every rank gives every rank the same streams.
    """
    import numpy as np
    import torch

    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
