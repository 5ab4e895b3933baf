"""ScalingConfig: how many ranks, and what each one gets."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpckit.config.values import is_int
from hpckit.errors import ConfigError

_RESOURCE_KEYS = ("CPU", "GPU")


@dataclass(frozen=True)
class ScalingConfig:
    """How many ranks to run and what each one uses.

    Ray's placement options (``placement_strategy``, ``trainer_resources``, ...) do not
    apply: the ranks are MPI processes that the launcher or the Slurm allocation places.

    Args:
        num_workers: Number of ranks (world size), an integer >= 1 (default 1). Under
            ``mpirun``/``srun`` it must equal the launched world; with ``python train.py``
            hpckit starts this many ranks (on this node, or across the Slurm allocation it
            runs in). ``(min_workers, max_workers)``, as Ray's elastic training: hpckit
            starts up to ``max_workers`` ranks, goes on with fewer (never under
            ``min_workers``) after a node is lost with no spare, and grows back when it
            returns.
        use_gpu: Train on CUDA devices with NCCL; False (the default) on CPUs with Gloo.
        resources_per_worker: ``{"GPU": n, "CPU": m}``, each > 0: GPUs per rank (may be
            fractional to share a device; needs ``use_gpu=True``) and a whole number of CPU
            threads per rank (sets ``torch.set_num_threads``). None (the default): one GPU
            per rank with ``use_gpu``, and as threads the rank's CPUs (its affinity mask,
            shared with the local ranks bound to the same CPUs).
        elastic_resize_monitor_interval_s: An elastic run with fewer than ``max_workers``
            ranks asks this often (seconds >= 0, default 60, as in Ray) whether the nodes it
            lost are back, and grows back to them.

    Raises:
        ConfigError: A value is invalid; the message names it and what is accepted.
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:
        _check_workers(self.num_workers)
        if isinstance(self.num_workers, list):
            object.__setattr__(self, "num_workers", tuple(self.num_workers))
        interval = self.elastic_resize_monitor_interval_s
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise ConfigError(
                f"ScalingConfig(elastic_resize_monitor_interval_s={interval!r}) must be a "
                "number of seconds >= 0 (Ray's default is 60).")
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
    def min_workers(self) -> int:
        """The fewest ranks the run trains on: ``num_workers``, or an elastic run's minimum."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]

    @property
    def max_workers(self) -> int:
        """The most ranks the run trains on, and what hpckit starts where it can."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    def resized(self, ranks: int) -> ScalingConfig:
        """This config for a run of ``ranks`` ranks (``hpckit resume -n``): that many, and
        for an elastic run, no more and at most as few as it allowed.

        Args:
            ranks: The new world size, an integer >= 1.
        """
        workers: int | tuple[int, int] = (
            (min(self.min_workers, ranks), ranks) if self.elastic and ranks > 1 else ranks)
        return replace(self, num_workers=workers)

    @property
    def elastic(self) -> bool:
        """Whether the run may train on another number of ranks than it started with."""
        return self.min_workers != self.max_workers

    @property
    def gpus_per_worker(self) -> float:
        if not self.use_gpu:
            return 0.0
        return float((self.resources_per_worker or {}).get("GPU", 1))

    @property
    def cpus_per_worker(self) -> int | None:
        cpus = (self.resources_per_worker or {}).get("CPU")
        return None if cpus is None else int(cpus)


def _check_workers(workers: object) -> None:
    """An integer >= 1, or Ray's elastic ``(min_workers, max_workers)``."""
    if is_int(workers):
        if workers < 1:  # type: ignore[operator]
            raise ConfigError(
                f"ScalingConfig(num_workers={workers!r}) is invalid: num_workers must be an "
                "integer >= 1 (the number of ranks), or (min_workers, max_workers).")
        return
    pair = tuple(workers) if isinstance(workers, (tuple, list)) else ()
    if len(pair) != 2 or not all(is_int(n) for n in pair):
        raise ConfigError(
            f"ScalingConfig(num_workers={workers!r}) is invalid: give an integer >= 1, or a "
            "tuple (min_workers, max_workers) of two integers for an elastic run, such as (2, 4).")
    low, high = pair
    if not 1 <= low <= high:
        raise ConfigError(
            f"ScalingConfig(num_workers={workers!r}) is invalid: an elastic run needs "
            f"1 <= min_workers <= max_workers, such as ({max(1, min(low, high))}, "
            f"{max(1, low, high)}).")
