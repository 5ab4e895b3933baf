"""Progress bars for long transfers: drawn on a terminal, silent in batch logs."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from hpckit.storage.copy import PROGRESS_FROM


@pytest.fixture
def large_checkpoint(s3, tmp_path) -> str:
    fs = s3.filesystem()
    prefix = f"progress-{tmp_path.name}/checkpoint_000000"
    with fs.open_output_stream(f"hpckit/{prefix}/model.pt") as f:
        f.write(os.urandom(PROGRESS_FROM + (1 << 20)))
    return s3.uri(prefix)


def download(uri: str, target: str) -> list[str]:
    code = (f"from hpckit import Checkpoint; Checkpoint({uri!r}).to_directory({target!r}); "
            "print('DONE')")
    return [sys.executable, "-c", code]


def test_download_shows_a_bar_on_a_terminal_only(large_checkpoint, tmp_path):
    if shutil.which("script") is None:
        pytest.skip("util-linux `script` is needed to give the download a terminal")
    quiet = subprocess.run(download(large_checkpoint, str(tmp_path / "a")), capture_output=True,
                           text=True, timeout=120)
    assert "DONE" in quiet.stdout and "downloading" not in quiet.stdout + quiet.stderr
    command = shlex.join(download(large_checkpoint, str(tmp_path / "b")))
    tty = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True,
                         timeout=120)
    assert "DONE" in tty.stdout and "downloading" in tty.stdout and "100%" in tty.stdout, tty.stdout
    assert (tmp_path / "b" / "model.pt").stat().st_size == PROGRESS_FROM + (1 << 20)
