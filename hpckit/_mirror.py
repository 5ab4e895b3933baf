"""Mirrors: a second copy of the experiment (manifest, metrics, kept checkpoints) for
clusters whose scratch filesystem is purged.

Rank 0 mirrors in a background thread after a commit, at most once per ``sync_period``
seconds, and once more when the attempt ends. hpckit copies through pyarrow (checkpoints the
mirror lacks first, then metrics, then the manifest, so the mirror is always a consistent
experiment; then it removes checkpoints retention evicted), or runs ``mirror_command`` with
``{source}`` and ``{target}`` filled in. A failed mirror is logged and retried at the next
commit after the period: it never fails training.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from collections.abc import Callable

import pyarrow.fs

from hpckit import _experiment, _storage
from hpckit._log import log
from hpckit._manifest import MANIFEST_NAME, METRICS_NAME, Manifest, is_checkpoint_dirname
from hpckit._uri import Location, redact, resolve
from hpckit.config import SyncConfig
from hpckit.errors import HpckitError


class Mirror:
    def __init__(self, experiment: Location, name: str, config: SyncConfig,
                 current: Callable[[], Manifest | None]) -> None:
        assert config.mirror is not None
        self.current = current
        self.source = experiment
        self.config = config
        base, sep, query = config.mirror.partition("?")
        self.target_text = f"{base.rstrip('/')}/{name}{sep}{query}"
        self._target: Location | None = None
        self._last = float("-inf")
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.failures = 0
        self.mirrored = 0

    def after_commit(self, manifest: Manifest) -> None:
        """Start a mirror in the background unless one ran within the period or is running."""
        if time.monotonic() - self._last < self.config.sync_period:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._last = time.monotonic()
        snapshot = Manifest.from_json(manifest.to_json(), MANIFEST_NAME)
        self._thread = threading.Thread(target=self._mirror, args=(snapshot,), daemon=True,
                                        name="hpckit-mirror")
        self._thread.start()

    def close(self) -> None:
        """The final mirror, in the foreground, after any running one."""
        if self._thread is not None:
            self._thread.join()
        manifest = self.current()
        if manifest is not None:
            self._mirror(manifest)

    def _mirror(self, manifest: Manifest) -> None:
        with self._lock:
            started = time.perf_counter()
            try:
                if self.config.mirror_command:
                    self._run_command()
                else:
                    self._copy(manifest)
            except (HpckitError, OSError, subprocess.SubprocessError) as exc:
                self.failures += 1
                log.warning("mirror to %s failed (training goes on; retried after the next commit "
                            "once %.0f s have passed): %s", redact(self.target_text),
                            self.config.sync_period, redact(str(exc)))
                return
            self.mirrored += 1
            log.info("mirrored %s to %s in %.2f s", self.source.display, redact(self.target_text),
                     time.perf_counter() - started)

    def _run_command(self) -> None:
        assert self.config.mirror_command is not None
        source = self.source.path if self.source.is_local else self.source.display
        command = self.config.mirror_command.format(source=shlex.quote(source),
                                                    target=shlex.quote(self.target_text))
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        if done.returncode != 0:
            raise subprocess.SubprocessError(
                f"`{redact(command)}` exited with {done.returncode}: {done.stderr.strip()[-500:]}")

    def _copy(self, manifest: Manifest) -> None:
        if self._target is None:
            self._target = resolve(self.target_text)
        target = self._target
        _storage.make_dir(target)
        present = {i.base_name for i in _storage.list_dir(target)
                   if i.type == pyarrow.fs.FileType.Directory}
        mirrored = _experiment.read_manifest(target)
        complete = {r.directory for r in mirrored.checkpoints} & present if mirrored else set()
        for record in manifest.checkpoints:
            if record.directory in complete:
                continue
            _storage.delete_dir(target.join(record.directory))  # a partial copy of an earlier try
            for f in record.files:
                _copy_file(self.source.join(record.directory, f.path),
                           target.join(record.directory, f.path))
        if _storage.file_type(self.source.join(METRICS_NAME)) == pyarrow.fs.FileType.File:
            _storage.write_atomic(target.join(METRICS_NAME),
                                  _storage.read_bytes(self.source.join(METRICS_NAME)))
        _storage.write_atomic(target.join(MANIFEST_NAME), manifest.to_json().encode())
        kept = {r.directory for r in manifest.checkpoints}
        for name in present - kept:
            if is_checkpoint_dirname(name):
                _storage.delete_dir(target.join(name))


def _copy_file(source: Location, target: Location) -> None:
    with _storage.errors_named(source, "mirror"):
        target.filesystem.create_dir(target.parent.path, recursive=True)
        with source.filesystem.open_input_stream(source.path) as src, \
                target.filesystem.open_output_stream(target.path) as dst:
            _storage.pipe_hashed(src, dst, window=_storage.UPLOAD_WINDOW)
