"""ScalingConfig: how many ranks, and what each one gets."""

from __future__ import annotations

from dataclasses import dataclass

from hpckit.config.values import is_int
from hpckit.errors import ConfigError

_RESOURCE_KEYS = ("CPU", "GPU")


@dataclass(frozen=True)
class ScalingConfig:
    """How many ranks to run and what each one uses."""

    num_workers: int = 1
    """Number of ranks (world size). Under ``mpirun``/``srun`` it must equal the launched
    world; with ``python train.py`` hpckit starts this many ranks on this node."""

    use_gpu: bool = False
    """Train on CUDA devices with NCCL; otherwise on CPUs with Gloo."""

    resources_per_worker: dict[str, float] | None = None
    """``{"GPU": n, "CPU": m}``: GPUs per rank (may be fractional to share a device) and
    CPU threads per rank (sets ``torch.set_num_threads``)."""

    def __post_init__(self) -> None:
        if not is_int(self.num_workers) or self.num_workers < 1:
            raise ConfigError(
                f"ScalingConfig(num_workers={self.num_workers!r}) is invalid: "
                "num_workers must be an integer >= 1 (the number of ranks).")
        if not isinstance(self.use_gpu, bool):
            raise ConfigError(f"ScalingConfig(use_gpu={self.use_gpu!r}) must be True or False.")
        resources = self.resources_per_worker
        if resources is None:
            return
        if not isinstance(resources, dict):
            raise ConfigError(
                f"ScalingConfig(resources_per_worker={resources!r}) must be a dict such as "
                '{"GPU": 1, "CPU": 4}.')
        for key, value in resources.items():
            if key not in _RESOURCE_KEYS:
                raise ConfigError(
                    f"ScalingConfig(resources_per_worker) has unknown resource {key!r}; "
                    f"accepted: {', '.join(_RESOURCE_KEYS)}.")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(
                    f"ScalingConfig(resources_per_worker[{key!r}]={value!r}) must be a number > 0.")
        if resources.get("GPU") and not self.use_gpu:
            raise ConfigError(
                f"ScalingConfig(resources_per_worker={resources!r}) asks for GPUs but use_gpu=False; "
                "set use_gpu=True or drop the GPU entry.")
        if "CPU" in resources and not float(resources["CPU"]).is_integer():
            raise ConfigError(
                f"ScalingConfig(resources_per_worker['CPU']={resources['CPU']!r}) must be a whole "
                "number of CPU threads.")

    @property
    def gpus_per_worker(self) -> float:
        if not self.use_gpu:
            return 0.0
        return float((self.resources_per_worker or {}).get("GPU", 1))

    @property
    def cpus_per_worker(self) -> int | None:
        cpus = (self.resources_per_worker or {}).get("CPU")
        return None if cpus is None else int(cpus)
