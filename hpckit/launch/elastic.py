"""Elastic runs (``ScalingConfig(num_workers=(min_workers, max_workers))``, as Ray's) across a
Slurm allocation: as many ranks as the nodes not lost hold, never under the least; after a
node is lost with no spare, the next attempt goes on with fewer; while it runs with fewer, the
lost nodes are asked every ``elastic_resize_monitor_interval_s`` whether they are back, and
the step is given up on to start again on more ranks, from the last committed checkpoint, as
Ray restarts its workers to resize. A checkpoint that another number of ranks cannot load
(:mod:`hpckit.experiment.opening`) is refused before a restart that would need it.

Outside an allocation an elastic run starts its most ranks on this node, as Ray asks for its
most workers; under mpirun or srun it takes the world it was given, within its range.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hpckit.experiment.opening import resize_refusal
from hpckit.experiment.reading import read_manifest
from hpckit.launch import lost
from hpckit.launch.allocation import Allocation, current
from hpckit.launch.process import Launch, stop_passed_on
from hpckit.launch.steps import AllocationSteps
from hpckit.logs import log
from hpckit.run.job import TrainingJob
from hpckit.settings import Settings
from hpckit.storage.location import Location


def steps_for(settings: Settings, job: TrainingJob, program: list[str],
              experiment: Location) -> ElasticSteps | None:
    """An elastic run's steps across the allocation this process runs in; None for a run
    of one size, or outside an allocation."""
    allocation = current(settings)
    scaling = job.scaling_config
    if allocation is None or not scaling.elastic:
        return None
    extra = job.validation_ranks
    steps = ElasticSteps(settings, (scaling.min_workers + extra, scaling.max_workers + extra),
                         program, allocation, scaling.elastic_resize_monitor_interval_s)
    steps.resizable = lambda ranks: refusal(experiment, extra, ranks)
    return steps


def refusal(experiment: Location, validating: int, launched: int) -> str | None:
    """Why the run's last committed checkpoint cannot be loaded by ``launched`` ranks (the
    ``validating`` ones set aside among them); None where it can."""
    training = launched - validating
    manifest = read_manifest(experiment)
    if manifest is None:
        return None
    return resize_refusal(
        manifest.latest, manifest.world_size, training,
        asked=f"the elastic restart on {training} rank(s)",
        keep=f"Keep {manifest.world_size} rank(s) with a spare node, or ScalingConfig("
             f"num_workers={manifest.world_size})")


class ElasticSteps(AllocationSteps):
    """An elastic run's steps (``ScalingConfig(num_workers=(min, max))``): as many ranks as
    the nodes not lost hold, up to the most; with fewer than the most, every ``grow_every_s``
    the lost nodes are asked whether they are back, and the step is given up on to start
    again on more ranks (from the last committed checkpoint, as Ray restarts its workers)."""

    def __init__(self, settings: Settings, ranks: tuple[int, int], program: list[str],
                 allocation: Allocation, grow_every_s: float) -> None:
        super().__init__(settings, ranks[1], program, allocation)
        self.minimum, self.maximum = ranks
        self._grow_every_s = grow_every_s
        # Why the last committed checkpoint cannot be loaded by that many ranks (None: it can).
        self.resizable: Callable[[int], str | None] = lambda ranks: None
        self._refused: str | None = None  # said once

    @property
    def fewest(self) -> int:
        return self.minimum

    def next_ranks(self) -> int:
        alive = len(self.allocation.nodes) - len(self.lost)
        return max(self.minimum, min(self.maximum, alive * self.allocation.tasks_per_node))

    def launch(self) -> Launch:
        self.ranks, self.growing = self.next_ranks(), False
        return super().launch()

    def watch(self, alive: str) -> Callable[[], bool] | None:
        lost_watch = super().watch(alive)
        asked = [time.monotonic()]

        def give_up() -> bool:
            if lost_watch is not None and lost_watch():
                return True
            if self.ranks >= self.maximum or not self.lost or stop_passed_on() or \
                    time.monotonic() - asked[0] < self._grow_every_s:
                return False  # a run that stops commits first: its step is not given up
            asked[0] = time.monotonic()
            back = self._find_returned()
            self.growing = bool(back) and self.next_ranks() > self.ranks and self._may_grow(back)
            if self.growing:
                log.warning("node(s) %s of Slurm job %s are back; the run grows to %d rank(s) "
                            "from its last committed checkpoint", ",".join(sorted(back)),
                            self.allocation.job_id, self.next_ranks())
            return self.growing
        return give_up

    def _may_grow(self, back: frozenset[str]) -> bool:
        """Whether the last committed checkpoint loads on the ranks the nodes ``back`` would
        add; where not, they stay out (asked again later: a newer checkpoint may load)."""
        refused = self.resizable(self.next_ranks())
        if refused:
            if refused != self._refused:
                log.warning("the run stays on %d rank(s): %s", self.ranks, refused)
            self._refused = refused
            self.lost |= back
            self.returned -= back
        return not refused

    def _find_returned(self) -> frozenset[str]:
        back = lost.returned(tuple(sorted(self.lost)), self.allocation.job_id)
        self.lost -= back
        self.returned |= back
        return back
