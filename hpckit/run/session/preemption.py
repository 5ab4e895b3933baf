"""``get_preemption_info()``: whether the job has been told that it will end, as in Ray.

On a cluster the job learns it from the stop signal (``HPCKIT_STOP_SIGNAL``, SIGUSR2 by
default: Slurm's time-limit warning ``--signal=USR2@120``, or ``scancel --signal=USR2``) or
from SIGTERM (Slurm's preemption, which ends the job GraceTime seconds later). The stop
machinery (:mod:`hpckit.run.ending.stop`) already catches both on every rank; this asks the ranks
together, so they all get one answer. The deadline is the job's end time as Slurm gives it:
the time limit, or the preemption time plus the grace time.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpckit import settings as _settings
from hpckit.errors import HpckitError
from hpckit.run.ending import stop
from hpckit.run.mpi.comm import all_reduce
from hpckit.run.mpi.waiting import from_root, share
from hpckit.run.session.session import Session, current

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


@dataclass(frozen=True)
class PreemptionInfo:
    """The job will end: by ``deadline_ms`` (milliseconds since the epoch; None where Slurm
    does not say), on the nodes in ``preempted_node_to_ranks`` (every node of the job, since
    the whole job ends), each with its world ranks.

    Args:
        deadline_ms: When the job ends, in milliseconds since the epoch: its time limit, or
            the preemption time plus the partition's grace time, as ``squeue`` gives it.
            None outside Slurm, or where Slurm does not say.
        preempted_node_to_ranks: Each node's hostname mapped to the world ranks that run on
            it.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})


def get_preemption_info() -> PreemptionInfo | None:
    """None until a rank of the job has received the stop signal; from then on, on every
    rank, the same :class:`PreemptionInfo`. Collective: every rank calls it the same number
    of times. The next ``report()`` still stops the run after its checkpoint, as always.

    Raises:
        HpckitError: Called outside a training run, or the ranks could not agree (the
            message names the ranks that failed).
    """
    session = current("get_preemption_info")
    topology = session.context.topology
    return all_reduce(session.protocol.comm, "get_preemption_info()",
                      lambda: (stop.received(), topology.hostname, topology.world_rank),
                      _agreed, HpckitError)


def _agreed(heard: list[tuple[str | None, str, int]]) -> PreemptionInfo | None:
    if not any(signal for signal, _, _ in heard):
        return None
    return _info([(host, rank) for _, host, rank in heard], job_end_ms(_settings.current()))


def _info(ranks: list[tuple[str, int]], deadline_ms: int | None) -> PreemptionInfo:
    nodes: dict[str, list[int]] = {}
    for host, rank in ranks:
        nodes.setdefault(host, []).append(rank)
    return PreemptionInfo(deadline_ms, nodes)


def preemption_info(comm: Comm, session: Session, settings: _settings.Settings) -> PreemptionInfo:
    """Every rank, together, once a stop ended the run: what ``PreemptionError`` carries."""
    topology = session.context.topology
    ranks = share(comm, (topology.hostname, topology.world_rank))
    return _info(ranks, from_root(comm, job_end_ms(settings) if comm.rank == 0 else None))


def not_requeued_after(signal_name: str, settings: _settings.Settings) -> str | None:
    """Why a run stopped by ``signal_name`` must not be requeued, or None. A SIGTERM (where
    it is not the stop signal itself) is requeued only when Slurm preempted the job (its
    PreemptTime is set): Slurm does not requeue a preempted job that ends by itself within
    its grace time, and a job cancelled (``scancel``), at its time limit, or killed must
    stay ended."""
    if signal_name != signal.SIGTERM.name or settings.stop_signal == signal.SIGTERM:
        return None
    scontrol = shutil.which("scontrol")
    if not scontrol:
        return "SIGTERM, and there is no scontrol to ask Slurm whether it preempted the job"
    try:
        out = subprocess.run([scontrol, "show", "job", "-o", str(settings.slurm_job_id)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SIGTERM, and asking Slurm whether it preempted the job failed: {exc}"
    found = re.search(r"\bPreemptTime=(\S+)", out.stdout)
    if out.returncode != 0 or found is None:
        return ("SIGTERM, and `scontrol show job` did not say whether Slurm preempted the job: "
                f"{out.stderr.strip() or 'no PreemptTime'}")
    if found.group(1) in ("None", "Unknown"):
        return "SIGTERM without a Slurm preemption (scancel, the time limit, or kill)"
    return None


def job_end_ms(settings: _settings.Settings) -> int | None:
    """When Slurm will end this job (its time limit, or the preemption time plus the grace
    time), or None outside Slurm or unknown."""
    squeue = shutil.which("squeue")
    if not settings.slurm_job_id or not squeue:
        return None
    try:
        out = subprocess.run([squeue, "-h", "-j", settings.slurm_job_id, "-o", "%e"],
                             capture_output=True, text=True, timeout=30)
        return int(time.mktime(time.strptime(out.stdout.strip(), "%Y-%m-%dT%H:%M:%S")) * 1000)
    except (OSError, subprocess.TimeoutExpired, ValueError, OverflowError):
        return None

