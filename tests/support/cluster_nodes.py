"""Several "nodes" on this one machine, for the tests of what crosses nodes.

MPICH's mpiexec starts one proxy per host through a command of ours (``nodes/launch-node``)
instead of ssh. Each proxy, and the ranks it starts, get their own hostname and their own
node-local disk (seen at ``Nodes.local``, where ``HPCKIT_LOCAL_DIR`` and ``TMPDIR`` point),
while sharing the filesystem that holds the experiment and the loopback network, as the
nodes of a cluster share a parallel filesystem. MPI sees separate hosts: ranks of different
"nodes" talk over TCP, and ``get_node_rank()`` counts them.

A node's disk is a small tmpfs of its own, a filesystem apart from the experiment's as an
NVMe drive is (a rename between them fails), mounted before the job and kept after it, so a
test can lose it between runs. The fixture unmounts every disk, by path, at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import HERE, MPIEXEC, Run, run

LAUNCHER = HERE / "nodes" / "launch-node"
DISK_SIZE = "64m"


def missing() -> str | None:
    """Why this machine cannot run the nodes, or None."""
    if os.geteuid() != 0:
        return "the nodes need root (unshare of the hostname and mounts)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return None


@dataclass(frozen=True)
class Nodes:
    root: Path

    @property
    def local(self) -> Path:
        """The node-local directory, as every rank sees it: its own node's disk."""
        return self.root / "local"

    def disk(self, host: str) -> Path:
        """A node's local disk, from outside the nodes."""
        return self.root / "disks" / host

    def mount_disk(self, host: str) -> None:
        disk = self.disk(host)
        if not os.path.ismount(disk):
            disk.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}",
                            f"hpckit-test-{host}", str(disk)], check=True)

    def lose_disk(self, host: str) -> None:
        """The node's disk and all on it are gone (a replaced drive: empty, next time)."""
        subprocess.run(["umount", str(self.disk(host))], check=True)

    def unmount_all(self) -> None:
        disks = self.root / "disks"
        for disk in disks.iterdir() if disks.is_dir() else ():
            if os.path.ismount(disk):
                subprocess.run(["umount", "--lazy", str(disk)], check=False)

    def mpiexec(self, hosts: list[str], per_node: int, script: Path, *args: str,
                env: dict[str, str] | None = None, timeout: float = 120,
                expect: int | None = 0) -> Run:
        """``per_node`` ranks of ``script`` on each of ``hosts``, rank order by host."""
        self.local.mkdir(parents=True, exist_ok=True)
        for host in hosts:
            self.mount_disk(host)
        command = [MPIEXEC, "-launcher", "ssh", "-launcher-exec", str(LAUNCHER),
                   "-hosts", ",".join(hosts), "-ppn", str(per_node), "-prepend-rank",
                   "-n", str(len(hosts) * per_node), sys.executable, str(script), *args]
        local = {"HPCKIT_TEST_NODES": str(self.root), "HPCKIT_LOCAL_DIR": str(self.local),
                 "TMPDIR": str(self.local)}
        return run(command, timeout, {**local, **(env or {})}, expect)


@pytest.fixture
def nodes(tmp_path):
    """The nodes of one test (import this fixture into a test module); their disks are
    unmounted at its end."""
    absent = missing()
    if absent:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test across nodes, but {absent}")
        pytest.skip(absent)
    cluster = Nodes(tmp_path / "nodes")
    yield cluster
    cluster.unmount_all()
