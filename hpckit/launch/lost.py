"""Which nodes of a job step are lost, told without waiting for Slurm to mark them DOWN
(``SlurmdTimeout``: 300 s at most sites), and the end of a step that waits for them.

A node is lost when its slurmd does not accept a connection within :data:`ANSWER_S`: refused
at once where the daemon died, timed out where the host did. Only the nodes of a step whose
ranks have failed are asked, once, so a healthy run sends slurmd nothing.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

from hpckit.errors import LaunchError
from hpckit.launch.allocation import hostnames
from hpckit.logs import log

ANSWER_S = 3.0
SLURMD_PORT = 6818  # Slurm's default, where scontrol names no port of the node's own


def lost_nodes(nodes: tuple[str, ...]) -> frozenset[str]:
    """The ``nodes`` whose slurmd does not answer."""
    if not nodes:
        return frozenset()
    addresses = slurmd_addresses(nodes)
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        answers = pool.map(lambda n: _answers(*addresses.get(n, (n, SLURMD_PORT))), nodes)
        return frozenset(n for n, answered in zip(nodes, answers, strict=True) if not answered)


UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT", "MAINT")


def returned(nodes: tuple[str, ...], job_id: str) -> frozenset[str]:
    """Which of the lost ``nodes`` are back: their slurmd answers, Slurm takes them for up
    (not DOWN, drained or not responding), and the job still holds them (Slurm takes a node
    it marked DOWN out of a ``--no-kill`` job for good)."""
    if not nodes:
        return frozenset()
    held = _job_nodes(job_id)
    states = _node_fields(nodes)
    candidates = tuple(n for n in nodes if n in held and n in states
                       and not any(word in states[n].get("State", "") for word in UNUSABLE))
    return frozenset(candidates) - lost_nodes(candidates)


def _job_nodes(job_id: str) -> frozenset[str]:
    """The nodes Slurm still counts in the job (none where scontrol cannot say)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                             text=True, timeout=30).stdout
        listed = dict(f.split("=", 1) for f in out.split() if "=" in f).get("NodeList", "")
        return frozenset(hostnames(listed)) if listed and listed != "(null)" else frozenset()
    except (OSError, subprocess.SubprocessError, LaunchError) as exc:
        log.warning("cannot ask scontrol for the nodes of job %s (%s)", job_id, exc)
        return frozenset()


def _node_fields(nodes: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Each node's fields as ``scontrol show node -o`` gives them (none where it fails)."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", ",".join(nodes)],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot ask scontrol about nodes %s (%s)", ",".join(nodes), exc)
        return {}
    found = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields
    return found


def slurmd_addresses(nodes: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """Each node's slurmd address and port, as ``scontrol show node`` gives them."""
    found = {}
    for name, fields in _node_fields(nodes).items():
        port = fields.get("Port", "")
        found[name] = (fields.get("NodeAddr", name), int(port) if port.isdigit() else SLURMD_PORT)
    return found


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=ANSWER_S):
            return True
    except OSError:
        return False


def cancel_step(job_id: str, step_name: str) -> None:
    """SIGKILL the tasks of the job's step named ``step_name`` on every node that can still
    be reached, so that none of them outlives the step's srun. Not waited for: ``scancel``
    returns only once Slurm has given up on the lost node too (``MessageTimeout``, 10 s),
    while the tasks on the others end at once."""
    try:
        steps = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={job_id}",
                                "--format=%i %j"], capture_output=True, text=True,
                               timeout=30).stdout
        ids = [i for i, _, name in (line.partition(" ") for line in steps.splitlines())
               if name.strip() == step_name]
        if ids:
            cancel = subprocess.Popen(["scancel", "--signal=KILL", *ids],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            threading.Thread(target=cancel.wait, name="hpckit-scancel", daemon=True).start()
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not cancel job step %s of job %s (%s); its tasks on reachable "
                    "nodes end when the job does", step_name, job_id, exc)
