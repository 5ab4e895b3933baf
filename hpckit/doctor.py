"""``hpckit doctor``: the checks a user runs on a new cluster before submitting a large job.

Each check returns a :class:`Finding` with its fix. :func:`checkup` runs them all, on every
rank (run alone, under ``mpiexec`` or as ``srun hpckit doctor``): every rank checks what it
sees, and rank 0 gets the findings. The checks, by subject: the MPI that mpi4py loaded, the
launcher hpckit would use, how the ranks were launched and where they run; the torch build,
``import torch``'s time and the GPUs each rank sees; the storage path and the node-local
cache; the Slurm job's signal and requeue settings, the start-up hook that keeps a stop signal
sent while a rank starts, and whether the batch node reaches every node's slurmd.

May import: launch (which mpiexec hpckit would use, the job's nodes), run.mpi (the ranks'
messages), storage, settings and the ground layer. Never torch: the torch build is
inspected in a child process, which also measures how long ``import torch`` takes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.fs

from hpckit.errors import HpckitError, LaunchError
from hpckit.launch.allocation import hostnames
from hpckit.launch.lost import lost_nodes, slurmd_addresses
from hpckit.launch.process import find_mpiexec, launcher_version
from hpckit.run.job import DEFAULT_STORAGE
from hpckit.run.mpi.library import implementation, loaded_version, srun_plugin
from hpckit.run.mpi.waiting import from_root, gather_to_root
from hpckit.settings import Settings, variable
from hpckit.storage import files
from hpckit.storage.location import Location, resolve

if TYPE_CHECKING:
    from mpi4py.MPI import Comm

OK, INFO, WARN, FAIL = "ok", "info", "warn", "FAIL"


@dataclass(frozen=True)
class Finding:
    """What one check found: a value, never mutated, that crosses MPI and becomes a table
    row."""

    check: str
    status: str  # OK, INFO, WARN or FAIL
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def worst(findings: list[Finding]) -> str:
    """The most serious status among ``findings``."""
    order = (OK, INFO, WARN, FAIL)
    return max((f.status for f in findings), key=order.index, default=OK)


def checkup(comm: Comm, settings: Settings, storage_path: str | None,
            cache_dir: str | None) -> tuple[list[Finding] | None, int]:
    """Every check, on every rank: the findings (on rank 0; None elsewhere) and the exit
    status every rank returns: 1 when a check failed, else 0."""
    version = loaded_version()
    mine: dict[str, Any] = {"host": socket.gethostname(), "torch": torch_seen()}
    everyone = gather_to_root(comm, mine)
    location = resolve(os.path.expanduser(storage_path or settings.storage or DEFAULT_STORAGE))
    shared = shared_storage(comm, location)
    cached = node_cache(comm, cache_dir)
    findings = None
    if comm.rank == 0 and everyone is not None:
        findings = [
            mpi_library(version), launcher(settings, version),
            launched(settings, comm.size, version), placement([r["host"] for r in everyone]),
            *torch_build([r["torch"] for r in everyone]),
            gpus([r["torch"] for r in everyone]), nccl(),
            *[f for f in (shared, cached) if f is not None],
            early_stop(), *job_settings(settings),
            lost_node_watch(settings)]
    status = from_root(comm, 1 if findings and worst(findings) == FAIL else 0)
    return findings, int(status)


# The MPI side: the library mpi4py loaded, the launcher hpckit would use, how this process
# was launched, and where the ranks run.

def mpi_library(version: str) -> Finding:
    import mpi4py

    found = f"{version} (mpi4py {mpi4py.__version__})"
    if implementation(version) is None:
        return Finding("MPI library", WARN, found, "hpckit is tested with MPICH, Open MPI and "
                       "Intel MPI; others may work (docs/site.md)")
    return Finding("MPI library", OK, found)
def launcher(settings: Settings, version: str) -> Finding:
    """The mpiexec that ``python train.py`` would start ranks with, against the library."""
    found = find_mpiexec(settings)
    if not found:
        return Finding("launcher", WARN, "no mpiexec next to python or on PATH",
                       "python train.py with num_workers > 1 cannot start ranks (srun and your "
                       f"own mpirun still can); pip install mpich, or set {variable('mpiexec')}")
    try:
        text = launcher_version(found)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("launcher", FAIL, f"{found} --version failed: {exc}",
                       f"set {variable('mpiexec')} to a working mpiexec")
    launch, loaded = implementation(text), implementation(version)
    shown = f"{found}: {launch or 'unknown'}"
    if launch and loaded and launch != loaded:
        return Finding("launcher", FAIL, f"{shown}, but mpi4py loaded {loaded}",
                       f"ranks it starts would not form one job: put {loaded}'s bin first on "
                       f"PATH or set {variable('mpiexec')} to its mpiexec (or rebuild mpi4py "
                       "against the site's MPI: pip install --no-binary mpi4py mpi4py)")
    return Finding("launcher", OK, shown)


def launched(settings: Settings, world_size: int, version: str) -> Finding:
    """How this process was started, and whether MPI saw the tasks its launcher started."""
    tasks, how = settings.launched_tasks, settings.launcher or "alone (a singleton)"
    if tasks is not None and tasks != world_size:
        loaded = implementation(version)
        fix = (f"srun --mpi={srun_plugin(version)} for {loaded or 'this MPI'} "
               "(srun --mpi=list shows what this Slurm offers)" if how == "srun" else
               "launch with the mpiexec of the MPI that mpi4py loaded (see 'launcher')")
        return Finding("launch", FAIL, f"{how} started {tasks} tasks, but MPI sees a world of "
                       f"{world_size}: each task runs alone", fix)
    pmi = _pmi(os.environ)
    slurm_mpi = os.environ.get("SLURM_MPI_TYPE")
    detail = ", ".join(filter(None, [pmi and f"PMI: {pmi}", slurm_mpi and f"srun --mpi={slurm_mpi}"]))
    return Finding("launch", OK, f"{how}, {world_size} rank(s)" + (f", {detail}" if detail else ""))


def _pmi(env: Any) -> str:
    if "PMIX_RANK" in env:
        return "PMIx"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "Open MPI's launcher"
    if "PMI_RANK" in env or "PMI_FD" in env:
        return "PMI-1/2"
    return ""


def placement(hosts: list[str]) -> Finding:
    """Ranks per node, from every rank's host name in rank order."""
    per_node = Counter(hosts)
    counts = sorted(set(per_node.values()))
    found = (f"{len(hosts)} rank(s) on {len(per_node)} node(s), "
             f"{'/'.join(map(str, counts))} per node")
    if len(counts) > 1:
        return Finding("ranks per node", WARN, found, "nodes run different numbers of ranks: "
                       "check --ntasks-per-node (or mpiexec -ppn)")
    return Finding("ranks per node", OK, found)


# The torch build, the time ``import torch`` takes, and the GPUs each rank sees; torch is
# imported in a child process, so that the doctor itself never imports it.

SLOW_IMPORT_S = 30.0  # beyond this, a stop signal sent at start-up meets a long window
PROBE = """
import json, time
started = time.perf_counter()
import torch
took = time.perf_counter() - started
cuda = torch.version.cuda
print(json.dumps({"version": torch.__version__, "cuda": cuda, "import_s": took,
                  "devices": torch.cuda.device_count() if cuda else 0}))
"""


def torch_seen() -> dict[str, Any]:
    """What this rank's torch is, as a child process of this rank finds it."""
    seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
            "gpu_node": os.path.exists("/dev/nvidia0")}
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {**seen, "error": str(exc)}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {**seen, "error": last}
    return {**seen, **json.loads(out.stdout.strip().splitlines()[-1])}


def torch_build(per_rank: list[dict[str, Any]]) -> list[Finding]:
    failed = [(rank, p["error"]) for rank, p in enumerate(per_rank) if "error" in p]
    if failed:
        rank, error = failed[0]
        return [Finding("torch", FAIL, f"rank {rank}: import torch failed: {error}",
                        f"install torch into {sys.executable}'s environment (docs/site.md: a "
                        "site-built torch with python -m venv --system-site-packages)")]
    builds = {(p["version"], p["cuda"]) for p in per_rank}
    slowest = max(p["import_s"] for p in per_rank)
    found = "; ".join(f"{v} ({'CUDA ' + c if c else 'CPU only'})" for v, c in sorted(builds,
                                                                                   key=str))
    build = (Finding("torch", FAIL, f"ranks differ: {found}", "use one environment on every "
                     "node (the same venv or module)") if len(builds) > 1
             else Finding("torch", OK, found))
    timing = Finding("import torch", OK if slowest < SLOW_IMPORT_S else WARN,
                     f"{slowest:.1f} s on the slowest of {len(per_rank)} rank(s)",
                     "" if slowest < SLOW_IMPORT_S else "a slow shared filesystem: put the "
                     "environment on node-local disk or in a container image, and send the "
                     "stop signal earlier: @300 rather than @120 in #SBATCH --signal (the "
                     "Slurm signal check says which form fits the batch script)")
    return [build, timing]


def gpus(per_rank: list[dict[str, Any]]) -> Finding:
    """GPUs visible to each rank, and builds that cannot use the node's GPUs."""
    if any("error" in p for p in per_rank):
        return Finding("GPUs", INFO, "not checked: torch did not import")
    counts = [p["devices"] for p in per_rank]
    visible = {p["visible"] for p in per_rank}
    found = (f"{'/'.join(map(str, sorted(set(counts))))} per rank, CUDA_VISIBLE_DEVICES="
             + ", ".join(sorted(str(v) for v in visible)))
    if any(p["gpu_node"] and not p["cuda"] for p in per_rank):
        return Finding("GPUs", WARN, found + "; the node has NVIDIA GPUs, torch is a CPU build",
                       "install torch from its CUDA index (HPCKIT_TORCH_INDEX, .ci/install)")
    if any(p["gpu_node"] and p["cuda"] and not p["devices"] for p in per_rank):
        return Finding("GPUs", WARN, found + "; a rank on a GPU node sees none",
                       "check CUDA_VISIBLE_DEVICES and the job's --gpus-per-task / --gres")
    return Finding("GPUs", OK if any(counts) else INFO, found)


def nccl() -> Finding:
    """The NCCL settings in the environment (names and values: none of them is a secret)."""
    found = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("NCCL_"))
    return Finding("NCCL variables", INFO, ", ".join(found) if found else "none set")


# The storage path (writable, and the same directory on every rank, as ``fit()`` checks) and
# the node-local cache directory.

MARKER = ".hpckit-doctor-"


def shared_storage(comm: Comm, location: Location) -> Finding | None:
    """Rank 0 writes a marker at ``location``; every rank must see it. The finding on rank 0."""
    marker, error = None, None
    if comm.rank == 0:
        marker, error = _leave_marker(location)
    marker, error = from_root(comm, (marker, error))
    if error is not None:
        return Finding("storage", FAIL, f"rank 0 cannot write {location.display}: {error}",
                       "choose a storage path this user can write (RunConfig(storage_path), "
                       "HPCKIT_STORAGE, or --storage)") if comm.rank == 0 else None
    seen = gather_to_root(comm, (_sees(location.join(marker)), socket.gethostname()))
    if comm.rank != 0 or seen is None:
        return None
    _remove(location.join(marker))
    blind = [(rank, host) for rank, (sees, host) in enumerate(seen) if not sees]
    if blind:
        rank, host = blind[0]
        return Finding("storage", FAIL, f"{location.display}: rank {rank} on {host} cannot see "
                       f"the file rank 0 wrote there ({len(blind)} rank(s) in all)",
                       "use a filesystem every node shares (Lustre, NFS) or S3; a node-local "
                       "path such as /tmp is a different directory on every node")
    return Finding("storage", OK, f"{location.display}: writable, the same directory on "
                   f"all {len(seen)} rank(s)")


def _leave_marker(location: Location) -> tuple[str, str | None]:
    marker = f"{MARKER}{uuid.uuid4().hex}"
    try:
        if location.is_local:
            files.make_dir(location)
        files.write_bytes(location.join(marker), b"")
    except HpckitError as exc:
        return marker, str(exc)
    return marker, None


def _sees(marker: Location) -> bool:
    try:
        return bool(files.file_type(marker) == pyarrow.fs.FileType.File)
    except HpckitError:
        return False


def _remove(marker: Location) -> None:
    try:
        files.delete_file(marker, missing_ok=True)
    except HpckitError:
        pass  # a stray marker is harmless: hpckit gc ignores what is not an experiment


def node_cache(comm: Comm, path: str | None) -> Finding | None:
    """CheckpointConfig(cache_dir=...): present and writable on every node."""
    problem = None if path is None else _cache_problem(path)
    found = gather_to_root(comm, (problem, socket.gethostname()))
    if comm.rank != 0 or found is None:
        return None
    if path is None:
        return Finding("node-local cache", INFO, "none given (--cache-dir checks one)")
    bad = [(rank, host, why) for rank, (why, host) in enumerate(found) if why]
    if bad:
        rank, host, why = bad[0]
        return Finding("node-local cache", FAIL, f"{path}: rank {rank} on {host}: {why} "
                       f"({len(bad)} rank(s) in all)", "create it on every node in the job "
                       "script (mkdir -p), or name a node-local disk that every node has "
                       "(/tmp, $TMPDIR, /local/scratch)")
    return Finding("node-local cache", OK, f"{path}: writable on all {len(found)} rank(s)")


def _cache_problem(path: str) -> str | None:
    if not os.path.isdir(path):
        return "no such directory"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=MARKER):
            pass
    except OSError as exc:
        return f"not writable ({exc.strerror})"
    return None


# The current Slurm job's settings that decide whether a stop is graceful: the warning
# signal before the time limit, and requeueing.

SIGNAL = re.compile(r"^#SBATCH\s+.*--signal[= ](\S+)", re.MULTILINE)
FOREGROUND_SRUN = re.compile(r"^\s*srun\b(?![^\n]*&\s*$)", re.MULTILINE)


def job_settings(settings: Settings) -> list[Finding]:
    job = settings.slurm_job_id
    if not job:
        return [Finding("Slurm job", INFO, "not in a Slurm job", "run inside salloc, or as "
                        "srun hpckit doctor in the job script, to check its settings")]
    scontrol = shutil.which("scontrol")
    if not scontrol:
        return [Finding("Slurm job", WARN, f"job {job}, but no scontrol on PATH",
                        "load the Slurm module: hpckit requeues with scontrol")]
    fields = _fields(scontrol, str(job))
    requeue = fields.get("Requeue")
    found = [Finding("Slurm job", OK, f"job {job}, time limit {fields.get('TimeLimit', '?')}")]
    found.append(Finding("Slurm requeue", OK, "Requeue=1") if requeue == "1" else
                 Finding("Slurm requeue", WARN, f"Requeue={requeue or '?'}", "submit with "
                         "#SBATCH --requeue, so that a stop or a preemption can requeue the job"))
    found.append(_signal(scontrol, str(job), settings, fields.get("BatchFlag") == "1"))
    return found


def _fields(scontrol: str, job: str) -> dict[str, str]:
    try:
        text = subprocess.run([scontrol, "show", "job", "-o", job], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(token.split("=", 1) for token in text.split() if "=" in token)


def _signal(scontrol: str, job: str, settings: Settings, batch: bool) -> Finding:
    """Slurm does not report a job's --signal; the batch script says it, when there is one."""
    if not batch:
        name = settings.stop_signal.name.removeprefix("SIG")
        return Finding("Slurm signal", INFO, "an interactive allocation (no batch script)",
                       f"in the batch script: #SBATCH --signal=B:{name}@120 and exec python "
                       "train.py (slurm/multi-node.sbatch)")
    try:
        script = subprocess.run([scontrol, "write", "batch_script", job, "-"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        script = ""
    return signal_in(script, settings.stop_signal)


def signal_in(script: str, stop: signal.Signals) -> Finding:
    """Whether the batch ``script``'s --signal reaches the ranks as ``stop``, and the fix that
    fits how it starts them: ``B:`` warns the batch process alone, which is right where it is
    the program that starts the ranks (``exec python train.py``) or passes the warning on
    (slurm/requeue.sbatch), and kills a shell that runs srun in the foreground; without
    ``B:`` Slurm warns the job step's tasks, the ranks themselves."""
    name = stop.name.removeprefix("SIG")
    foreground = bool(FOREGROUND_SRUN.search(script)) and not re.search(
        rf"^\s*trap\b[^\n]*\b(SIG)?{name}\b", script, re.MULTILINE)
    wanted = f"{name}@120" if foreground else f"B:{name}@120"
    given = SIGNAL.search(script)
    if given is None:
        return Finding("Slurm signal", WARN, "no #SBATCH --signal in the batch script",
                       f"#SBATCH --signal={wanted}: the job is then warned two minutes before "
                       "its time limit and checkpoints, instead of being killed")
    said = given.group(1)
    if said.startswith("B:") and foreground:
        return Finding("Slurm signal", WARN, f"--signal={said} warns the batch shell, which runs "
                       "srun in the foreground and dies of it", f"#SBATCH --signal={wanted} (the "
                       "ranks are warned), or trap the signal and pass it on, as "
                       "slurm/requeue.sbatch does")
    given_name = said.split("@")[0].removeprefix("B:").removeprefix("SIG")
    if given_name not in (name, str(int(stop))):
        return Finding("Slurm signal", WARN, f"--signal={said}, but hpckit stops on "
                       f"{stop.name}", f"#SBATCH --signal={wanted}, or set "
                       f"HPCKIT_STOP_SIGNAL={given_name}")
    return Finding("Slurm signal", OK, f"--signal={said}")


# Whether a stop signal that comes while a rank starts (before ``import hpckit``) is kept:
# the start-up hook in site-packages (``run/startup/hook.py``).

HOOK = "hpckit-early.pth"


def early_stop() -> Finding:
    source = os.path.join(os.path.dirname(__file__), "run", "startup", HOOK)
    if not getattr(sys, "hpckit_early_installed", False):
        return Finding("stop signal at start-up", WARN, f"{HOOK} is not in site-packages: a "
                       "stop signal before the script imports hpckit ends the rank",
                       f"reinstall hpckit with this Python (pip install -e . or pip install "
                       f"., which put it there), or cp {source} "
                       f"{sysconfig.get_paths()['purelib']}/")
    if os.environ.get("HPCKIT_EARLY_STOP", "1").lower() in ("0", "false", "no", "off"):
        return Finding("stop signal at start-up", INFO, "the hook is off (HPCKIT_EARLY_STOP=0)")
    active = getattr(sys, "hpckit_early_hook", None)
    return Finding("stop signal at start-up", OK, f"caught from the script's first line "
                   f"({active})" if active else "the hook is installed; it acts in ranks that "
                   "srun or mpiexec start")


# What telling a lost node within seconds needs, checked from where the driver runs (the batch
# node): every node's slurmd answering a TCP connection from here. hpckit takes a node whose
# ranks stopped beating for lost only when its slurmd does not answer (launch/lost.py); a node
# whose slurmd answers while its ranks hang is never taken for lost, and only
# ``FailureConfig(hang_timeout_s)`` ends that run (docs/slurm-lost-nodes.md).

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
