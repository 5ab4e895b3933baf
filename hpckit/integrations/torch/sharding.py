"""FSDP2 for ``prepare_model(parallel_strategy="fsdp")``: the model's parameters sharded
across the ranks with ``torch.distributed.fsdp.fully_shard``, on GPUs (NCCL) and on CPUs
(Gloo) alike. Save and resume its sharded state with DCP (``save_state_dcp``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hpckit.errors import ConfigError

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
