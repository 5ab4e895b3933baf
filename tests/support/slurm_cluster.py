"""A real Slurm for the tests: munged, slurmctld and slurmd from a private config directory, on
free loopback ports, each stopped by its PID. Nothing is installed system-wide.

One node is this host. Several nodes (``start(root, nodes=("n1", "n2", "n3"))``) are several
slurmd on this host, each on a port of its own and in namespaces of its own
(tests/nodes/slurm-node): its own hostname, its own small tmpfs as node-local disk at
one shared path (``Slurm.local``), and an /etc/hosts where every node resolves to loopback.
Killing a node's slurmd and every process under it is a node lost.

A one-node Slurm that binds each task to its cores (``start(root, bind_cores=True)``), as
sites with task/affinity or task/cgroup do, declares the machine's real cores, so that a
task's CPUs are real ones: what a rank of a step is given shows in its affinity."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from support import leftovers
from support.cluster_nodes import Nodes

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch")
HOLD_S = 2.0  # how long a requeued job stays held before hurry() starts it
NODE_LAUNCHER = Path(__file__).parent.parent / "nodes" / "slurm-node"
# Job ids: blocks of JOB_ID_BLOCK, below Slurm's largest job id (MaxJobId, 67,043,328). With
# two workers a block comes back after JOB_ID_BLOCKS / 8 = 8,375 s, and only to a cluster
# started exactly that long after (_first_job_id).
JOB_ID_BLOCK = 1000
JOB_ID_BLOCKS = 67_000
CLUSTERS_PER_WORKER = 4
_clusters_started = itertools.count()


def missing() -> list[str]:
    return [d for d in DAEMONS if not _which(d)]


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Slurm:
    root: Path
    env: dict[str, str]
    processes: list[subprocess.Popen] = field(default_factory=list)
    held_since: dict[str, float] = field(default_factory=dict)
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def disks(self) -> Nodes:
        """The nodes' local disks, laid out as tests/support/cluster_nodes.py lays out its nodes'."""
        return Nodes(self.root)

    @property
    def local(self) -> Path:
        """The node-local directory as a node's tasks see it: that node's own disk."""
        return self.disks.local

    def start_node(self, node: str) -> None:
        """Start (or bring back) one node's slurmd in its namespaces; its disk is kept."""
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        self.disks.mount_disk(node)
        self.nodes[node] = _spawn([NODE_LAUNCHER, node, self.root, _which("slurmd"), "-D",
                                   "-f", self.env["SLURM_CONF"], "-N", node], self.env)

    def pids_on(self, node: str) -> list[int]:
        """Every process running on ``node`` (in its UTS namespace), slurmd's included."""
        return _in_namespace(_uts_namespace(self.nodes[node].pid))

    def kill_node(self, node: str) -> None:
        """The node is lost: its slurmd and every process it started (job steps, ranks: all
        in the node's UTS namespace, since slurmstepd leaves slurmd's process tree) stopped,
        then SIGKILLed, so that none forks or answers in between. Its disk survives, as a
        rebooted node's."""
        process = self.nodes.pop(node)
        namespace = _uts_namespace(process.pid)  # unshare(1) enters it before it forks
        assert namespace != _uts_namespace(os.getpid()), f"{node} runs in this host's namespace"
        for signum in (signal.SIGSTOP, signal.SIGKILL):
            for pid in [process.pid, *_in_namespace(namespace)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        process.wait()

    def run(self, *command: str, timeout: float = 60, check: bool = True,
            env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(command, env={**self.env, **(env_extra or {})}, capture_output=True,
                              text=True, timeout=timeout, check=check)

    def hurry(self, job: str) -> None:
        """Start a requeued job soon: Slurm holds a requeued job back (Reason=BeginTime) for
        about half a minute, which is its scheduling policy, not hpckit's behaviour. Not at
        once: slurmd refuses a job started in the same second its last run was killed
        ('Job credential revoked') and Slurm then ends it FAILED."""
        out = self.run("scontrol", "show", "job", "-o", job, check=False)
        for line in out.stdout.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("JobState") != "PENDING" or fields.get("Reason") != "BeginTime":
                continue
            since = self.held_since.setdefault(fields["JobId"], time.monotonic())
            if time.monotonic() - since >= HOLD_S:
                self.run("scontrol", "update", f"JobId={fields['JobId']}", "StartTime=now",
                         check=False)
                del self.held_since[fields["JobId"]]

    def logs(self) -> str:
        parts = []
        for path in [self.root / "slurmctld.log", *sorted(self.root.glob("slurmd*.log"))]:
            if path.exists():
                parts.append(f"--- {path.name} ---\n" + "\n".join(path.read_text().splitlines()[-40:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job (their slurmstepd would outlive slurmd), then stop by PID."""
        if self.processes and self.processes[-1].poll() is None:
            jobs = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                _wait_for(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 60,
                          "jobs did not end after scancel")
        for node in list(self.nodes):
            self.kill_node(node)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.disks.unmount_all()


def _uts_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/uts")


def _in_namespace(namespace: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and os.readlink(entry / "ns" / "uts") == namespace:
                found.append(int(entry.name))
    return found


def start(root: Path, nodes: tuple[str, ...] = (), bind_cores: bool = False) -> Slurm:
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("munge-key", "munge-run", "state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    os.chmod(root / "munge-key", 0o700)
    os.chmod(root / "munge-run", 0o755)
    key = root / "munge-key" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    munge_socket = root / "munge-run" / "munge.socket"
    host = socket.gethostname()
    conf = root / "slurm.conf"
    conf.write_text(_config(root, host, munge_socket, nodes, bind_cores))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in list(env):
        if name.startswith(("SLURM_", "PMI_", "OMPI_")) and name != "SLURM_CONF":
            del env[name]
    slurm = Slurm(root, env)
    try:
        slurm.processes.append(_spawn(
            [_which("munged"), "--foreground", "--force", f"--socket={munge_socket}",
             f"--key-file={key}", f"--log-file={root}/munged.log",
             f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed"], env))
        _wait_for(lambda: munge_socket.exists(), 15, "munged did not create its socket")
        slurm.processes.append(_spawn([_which("slurmctld"), "-D", "-f", str(conf)], env))
        if nodes:
            (root / "hosts").write_text(f"127.0.0.1 localhost {host} {' '.join(nodes)}\n")
            for node in nodes:
                slurm.start_node(node)
        else:
            slurm.processes.append(_spawn([_which("slurmd"), "-D", "-f", str(conf), "-N", host],
                                          env))
        count = str(len(nodes) or 1)
        _wait_for(lambda: slurm.run("srun", "-N", count, "-t", "1", "true", timeout=30,
                                    check=False).returncode == 0, 90,
                  f"Slurm never ran `srun -N {count} true`")
    except BaseException:
        logs = slurm.logs()
        slurm.stop()
        raise RuntimeError(f"could not start Slurm in {root}:\n{logs}") from None
    return slurm


def _spawn(command: list[str | None], env: dict[str, str]) -> subprocess.Popen:
    """A daemon of the cluster, which outlives test modules (tests/support/leftovers.py)."""
    return subprocess.Popen([str(c) for c in command], env={**env, leftovers.DAEMON: "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _wait_for(ready, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.5)


def _node_lines(host: str, nodes: tuple[str, ...], bind_cores: bool = False) -> str:
    if not nodes:
        line = _real_node_line(host) if bind_cores else _node_line(host)
        return line + f"\nSlurmdPort={_free_port()}"
    # KillWait: a step's surviving tasks get SIGKILL 5 s after SIGTERM (sites: 30 s). Ranks
    # whose peer was killed cannot reach the report that a SIGTERM's stop waits for.
    return "KillWait=5\n" + "\n".join(f"{_node_line(n)} NodeHostname={host} Port={_free_port()}"
                                      for n in nodes)


def _node_line(host: str) -> str:
    """8 cores whatever the machine has (config_overrides), so 3- and 4-rank jobs fit on 2."""
    detected = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True).stdout
    memory = next((int(p.split("=")[1]) for p in detected.split() if p.startswith("RealMemory=")),
                  2048)
    return (f"NodeName={host} NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket=8 ThreadsPerCore=1 RealMemory={int(memory * 0.9)} State=UNKNOWN")


def _real_node_line(host: str) -> str:
    """The machine as slurmd sees it (its CPUs, sockets, cores and threads): tasks bound to
    cores are bound to real ones."""
    detected = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True).stdout
    fields = dict(p.split("=", 1) for p in detected.split() if "=" in p)
    hardware = " ".join(f"{k}={fields[k]}" for k in ("CPUs", "Boards", "SocketsPerBoard",
                                                      "CoresPerSocket", "ThreadsPerCore"))
    memory = int(int(fields.get("RealMemory", "2048")) * 0.9)
    return f"NodeName={host} NodeAddr=127.0.0.1 {hardware} RealMemory={memory} State=UNKNOWN"


def _first_job_id() -> int:
    """Where this cluster's job ids start: never where another cluster of the tests started
    in the last hours did. MPICH names a job step's node-local shared memory after its job
    id, and Slurm's ids never repeat on a real cluster. Two clusters with the same ids, on
    two workers or in one worker (the one-node and the three-node Slurm), had their ranks
    attach to each other's memory (#56). Each cluster takes a block of ids of its own,
    from the time it starts, its worker and how many this worker started before it."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    started = next(_clusters_started)
    assert started < CLUSTERS_PER_WORKER, f"a worker starts at most {CLUSTERS_PER_WORKER} Slurms"
    slots = workers * CLUSTERS_PER_WORKER
    block = (int(time.time()) * slots + worker * CLUSTERS_PER_WORKER + started) % JOB_ID_BLOCKS
    return block * JOB_ID_BLOCK + 1


def _config(root: Path, host: str, munge_socket: Path, nodes: tuple[str, ...],
            bind_cores: bool = False) -> str:
    tasks = "TaskPlugin=task/affinity\nTaskPluginParam=Cores" if bind_cores else \
        "TaskPlugin=task/none"
    return f"""\
ClusterName=hpckit-test
# Job ids never repeat on a real cluster; MPICH names node-local shared memory after them.
FirstJobId={_first_job_id()}
MaxJobId={JOB_ID_BLOCK * JOB_ID_BLOCKS + 1}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmUser=root
SlurmdUser=root
SlurmdParameters=config_overrides
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket},cred_expire=10
ProctrackType=proctrack/linuxproc
{tasks}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
MailProg=/bin/true
ReturnToService=2
SchedulerParameters=sched_interval=1,bf_interval=1
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
# A node whose slurmd stopped answering is DOWN after 10 s (sites: 300 s by default).
SlurmdTimeout=10
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{_node_lines(host, nodes, bind_cores)}
# An "urgent" job preempts a "test" job as a site's high-priority queue would: Slurm sends
# the test job's tasks SIGTERM, ends it GraceTime seconds later, and requeues it.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""
