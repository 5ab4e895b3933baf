"""Lightning's view of the job, taken from hpckit: who is who, and nobody to launch."""

from __future__ import annotations

import warnings

from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.utilities.warnings import PossibleUserWarning

import hpckit


class RayLightningEnvironment(LightningEnvironment):
    """Ranks, world size and node rank from hpckit's context, so that Lightning starts no
    processes and does not take the job for one of its own (``SLURMEnvironment`` under
    ``srun`` would). The torch process group is hpckit's, joined before the training
    function runs; Lightning finds it initialized and uses it."""

    def __init__(self) -> None:
        super().__init__()
        # Lightning's hint to "prepend srun" whenever srun exists is wrong here: hpckit's ranks
        # come from srun, mpirun or hpckit itself, and this environment takes them as they are.
        warnings.filterwarnings("ignore", message="The `srun` command is available",
                                category=PossibleUserWarning)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return hpckit.get_context().get_world_size()

    def global_rank(self) -> int:
        return hpckit.get_context().get_world_rank()

    def local_rank(self) -> int:
        return hpckit.get_context().get_local_rank()

    def node_rank(self) -> int:
        return hpckit.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """hpckit's world size is the truth; Lightning's own count is not kept."""

    def set_global_rank(self, rank: int) -> None:
        """hpckit's rank is the truth; Lightning's own count is not kept."""

    def teardown(self) -> None:
        """The process group is hpckit's: it ends it with the run."""
