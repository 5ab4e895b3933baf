"""A real S3-compatible server for the tests: SeaweedFS's `weed mini` on loopback ports with
static credentials, started in its own session and stopped by its PID."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from support import leftovers
import pyarrow.fs

ACCESS_KEY, SECRET_KEY = "hpckit-test-key", "hpckit-test-secret-0123456789"
BUCKET = "hpckit"


def weed() -> str | None:
    return shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")


def _free_pair() -> int:
    """A free port P whose gRPC companion P + 10000 is free too (SeaweedFS's convention)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for SeaweedFS")


@dataclass
class S3Server:
    process: subprocess.Popen
    port: int
    ports: list[int]
    root: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, path: str = "") -> str:
        """An s3:// URI with the credentials in its userinfo, as a user would write it."""
        return (f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}/{path}"
                f"?endpoint_override={self.endpoint}&scheme=http")

    def filesystem(self) -> pyarrow.fs.S3FileSystem:
        return pyarrow.fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                       endpoint_override=self.endpoint, scheme="http",
                                       allow_bucket_creation=True)

    def read_text(self, path: str) -> str:
        with self.filesystem().open_input_stream(f"{BUCKET}/{path}") as f:
            return f.read().decode()

    def kill(self) -> None:
        """SIGKILL, as a crashed server: no goodbye to its clients."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._remove_sockets()

    def restart(self) -> S3Server:
        """The same server on its ports and data, once it serves what it held: for a moment
        after a restart SeaweedFS takes a bucket but answers a GetObject of a stored object
        with INTERNAL_FAILURE (ci35, reading the manifest a killed run left)."""
        server = start(self.root, self.ports)
        fs = server.filesystem()
        stored = sorted((i for i in fs.get_file_info(pyarrow.fs.FileSelector(BUCKET, recursive=True))
                         if i.type == pyarrow.fs.FileType.File), key=lambda i: i.size)
        deadline = time.monotonic() + 60
        while stored:
            try:
                with fs.open_input_stream(stored[0].path) as stream:
                    stream.read()
                return server
            except OSError:
                if time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(f"SeaweedFS restarted but serves none of its objects:\n"
                                       f"{(self.root / 'weed.out').read_text()[-2000:]}") from None
                time.sleep(0.2)
        return server

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a few seconds: `weed mini` can take 20 s to shut down
        gracefully, and a test's server holds nothing worth the wait."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        for port in self.ports:
            for pattern in (f"/tmp/seaweedfs-*-{port}.sock", f"/tmp/seaweedfs-*-{port + 10000}.sock"):
                for sock in glob.glob(pattern):
                    os.unlink(sock)


def start(root: Path, ports: list[int] | None = None, daemon: bool = False) -> S3Server:
    """Start a server storing under ``root``; with ``ports``, a restart of an earlier one.
    A ``daemon`` (the session's server) may outlive a test module (tests/support/leftovers.py)."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "hpckit", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    master, volume, filer, s3, admin = ports or [_free_pair() for _ in range(5)]
    command = [weed(), f"-logdir={root}", "mini", f"-dir={root}/data", "-ip=127.0.0.1",
               "-ip.bind=127.0.0.1", f"-master.port={master}", f"-volume.port={volume}",
               f"-filer.port={filer}", f"-s3.port={s3}", f"-admin.port={admin}", "-admin.ui=false",
               "-webdav=false", "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
               f"-s3.config={config}", "-s3.autoCreateBucket=false"]
    env = {**os.environ, "GOMEMLIMIT": "512MiB",
           "WEED_FILER_OPTIONS_S3_EMPTY_FOLDER_CLEANUP_DELAY": "1s",
           **({leftovers.DAEMON: "1"} if daemon else {})}
    log = open(root / "weed.out", "a")
    process = subprocess.Popen([str(c) for c in command], stdout=log, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True)
    server = S3Server(process, s3, [master, volume, filer, s3, admin], root)
    deadline = time.monotonic() + 60
    while True:
        try:
            server.filesystem().create_dir(BUCKET)
            return server
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"SeaweedFS did not start:\n{(root / 'weed.out').read_text()}")
            time.sleep(0.5)
