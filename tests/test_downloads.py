"""A remote checkpoint opened with as_directory() by several processes of a node at once is
downloaded once, shared, and removed when the last of them leaves (a killed one included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from support.s3_server import BUCKET

READER = r"""
import os, sys, time
from hpckit import Checkpoint
with Checkpoint(sys.argv[1]).as_directory() as d:
    inode = os.stat(os.path.join(d, "model.bin")).st_ino
    size = os.path.getsize(os.path.join(d, "model.bin"))
    print("DIR", d, inode, size, flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.01)  # hold the copy until the test releases every reader
"""


def put_checkpoint(s3, name: str, size: int) -> str:
    with s3.filesystem().open_output_stream(f"{BUCKET}/{name}/model.bin") as f:
        f.write(os.urandom(size))
    return s3.uri(name)


def readers(uri: str, local: str, release: str, n: int) -> list[subprocess.Popen]:
    """``n`` processes that open the checkpoint and hold it until ``release`` exists."""
    env = {**os.environ, "HPCKIT_LOCAL_DIR": local}
    return [subprocess.Popen([sys.executable, "-c", READER, uri, release], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(n)]


def opened(process: subprocess.Popen) -> str:
    """The line a reader prints once it holds the checkpoint's directory."""
    line = process.stdout.readline()
    assert line.startswith("DIR "), f"the reader failed: {line}{process.communicate()[0]}"
    return line


def test_concurrent_users_share_one_download_removed_after_the_last(s3, tmp_path):
    uri = put_checkpoint(s3, "downloads/shared", 32 << 20)
    release = tmp_path / "release"
    procs = readers(uri, str(tmp_path), str(release), 4)
    lines = [opened(p) for p in procs]  # all four hold the copy at once
    release.touch()
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    seen = {tuple(line.split()[1:]) for line in lines}
    assert len(seen) == 1, f"the processes did not share one copy: {seen}"
    assert next(iter(seen))[2] == str(32 << 20)
    left = [p for p in (tmp_path / "hpckit-downloads").iterdir() if p.is_dir()]
    assert not left, f"the copy outlived its users: {left}"


def test_a_killed_user_does_not_keep_the_copy_alive(s3, tmp_path):
    uri = put_checkpoint(s3, "downloads/killed", 1 << 20)
    release = tmp_path / "release"
    (victim,) = readers(uri, str(tmp_path), str(release), 1)
    opened(victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    release.touch()
    (survivor,) = readers(uri, str(tmp_path), str(release), 1)
    assert survivor.communicate(timeout=60)[0].startswith("DIR ")
    assert not any(p.is_dir() for p in (tmp_path / "hpckit-downloads").iterdir())
