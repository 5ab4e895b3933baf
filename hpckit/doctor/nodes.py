"""What telling a lost node within seconds needs, checked from where the driver runs (the batch
node): every node's slurmd answering a TCP connection from here. hpckit takes a node whose
ranks stopped beating for lost only when its slurmd does not answer (launch/lost.py); a node
whose slurmd answers while its ranks hang is never taken for lost, and only
``FailureConfig(hang_timeout_s)`` ends that run (docs/slurm-lost-nodes.md)."""

from __future__ import annotations

import socket

from hpckit.doctor.finding import INFO, OK, WARN, Finding
from hpckit.errors import LaunchError
from hpckit.launch.allocation import hostnames
from hpckit.launch.lost import lost_nodes, slurmd_addresses
from hpckit.settings import Settings

HANGS = ("a node that hangs while its slurmd answers is not taken for lost: set "
         "FailureConfig(hang_timeout_s) to end such a run")


def lost_node_watch(settings: Settings) -> Finding:
    """Whether this node reaches the slurmd of every node of the job."""
    try:
        nodes = hostnames(settings.slurm_nodelist) if settings.slurm_nodelist else ()
    except LaunchError as exc:
        return Finding("lost nodes", WARN, str(exc), "load the Slurm module: hpckit asks "
                       "scontrol for the job's nodes")
    if len(nodes) < 2:
        return Finding("lost nodes", INFO, "not in a job of several nodes",
                       "run hpckit doctor in the batch script of a multi-node job to check "
                       "that its driver can tell a lost node")
    silent = sorted(lost_nodes(nodes))
    here = socket.gethostname()
    if silent:
        addresses = slurmd_addresses(tuple(silent))
        where = ", ".join(f"{n} ({':'.join(map(str, addresses.get(n, (n, '?'))))})"
                          for n in silent)
        return Finding("lost nodes", WARN, f"from {here}, the slurmd of {where} does not answer",
                       "let the batch node reach every node's SlurmdPort over TCP: otherwise a "
                       "lost node is told only when Slurm marks it DOWN (SlurmdTimeout), and "
                       "its spare waits that long")
    return Finding("lost nodes", OK, f"the slurmd of all {len(nodes)} nodes answers from {here}; "
                   f"{HANGS}")
