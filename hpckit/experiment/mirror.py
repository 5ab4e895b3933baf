"""Mirrors: a second copy of the experiment (manifest, metrics, kept checkpoints) for
clusters whose scratch filesystem is purged.

Rank 0 mirrors in a background thread after a commit, at most once per ``sync_period``
seconds, and once more when the attempt ends. hpckit copies through pyarrow (checkpoints the
mirror lacks first, then metrics, then the manifest, so the mirror is always a consistent
experiment; then it removes checkpoints retention evicted), or runs ``mirror_command`` with
``{source}`` and ``{target}`` filled in. A failed mirror is logged and retried at the next
commit after the period: it never fails training.

Copying a committed checkpoint elsewhere, checking every byte against the manifest.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_for

import pyarrow.fs

from hpckit.background import NORMAL, Worker
from hpckit.config import SyncConfig
from hpckit.errors import CheckpointError, HpckitError, ProtocolError
from hpckit.experiment import encoding, ownership
from hpckit.experiment.manifest import (
    MANIFEST_NAME,
    CheckpointRecord,
    Manifest,
    is_checkpoint_dirname,
    is_safe_relpath,
)
from hpckit.experiment.reading import read_manifest, segments
from hpckit.experiment.records import PARTS_DIR, read_records
from hpckit.logs import log
from hpckit.storage import files, uris
from hpckit.storage.copy import algorithm_of, copy_file, progress, short
from hpckit.storage.location import Location, resolve
from hpckit.storage.uris import redact


class Mirror:
    def __init__(self, experiment: Location, name: str, config: SyncConfig) -> None:
        if config.mirror is None:
            raise ProtocolError("a mirror was set up without SyncConfig(mirror=...)")
        self.source = experiment
        self.config = config
        self.target_text = uris.join(config.mirror, name)
        self._target: Location | None = None
        self._last = float("-inf")
        # Normal priority: it copies checkpoints that the purge may delete once newer ones come.
        self._worker = Worker("hpckit-mirror", NORMAL)
        self._running: Future[None] | None = None
        self._lock = threading.Lock()
        self.failures = 0
        self.mirrored = 0

    def after_commit(self, manifest: Manifest) -> None:
        """Start a mirror in the background unless one ran within the period or is running."""
        if time.monotonic() - self._last < self.config.sync_period:
            return
        if self._running is not None and not self._running.done():
            return
        self._last = time.monotonic()
        # The manifest is an immutable value: the worker may read it while training goes on.
        self._running = self._worker.submit(self._mirror, manifest)

    def close(self, manifest: Manifest) -> None:
        """The final mirror, in the foreground, after any running one."""
        if self._running is not None:
            wait_for([self._running])
        self._worker.stop()
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
        command = self.config.mirror_command
        if command is None:
            return
        source = self.source.path if self.source.is_local else self.source.display
        if callable(command):
            try:
                command(source, self.target_text)
            except Exception as exc:  # the user's function: its failure is the mirror's
                raise subprocess.SubprocessError(f"the syncer function raised {exc!r}") from exc
            return
        line = command.format(source=shlex.quote(source), target=shlex.quote(self.target_text))
        done = subprocess.run(line, shell=True, capture_output=True, text=True)
        if done.returncode != 0:
            raise subprocess.SubprocessError(
                f"`{redact(line)}` exited with {done.returncode}: {done.stderr.strip()[-500:]}")

    def _copy(self, manifest: Manifest) -> None:
        """Checkpoints only in node-local caches have nothing on storage_path to copy: the
        mirror's manifest names the others."""
        manifest = manifest.without([r for r in manifest.checkpoints if not r.on_storage])
        if self._target is None:
            self._target = resolve(self.target_text)
        target = self._target
        files.make_dir(target)
        present = {i.base_name for i in files.list_dir(target)
                   if i.type == pyarrow.fs.FileType.Directory}
        mirrored = read_manifest(target)
        complete = {r.directory for r in mirrored.checkpoints} & present if mirrored else set()
        for record in manifest.checkpoints:
            if record.directory in complete:
                continue
            files.delete_dir(target.join(record.directory))  # a partial copy of an earlier try
            for path in _paths_of(self.source, record):
                copy_file(self.source.join(record.directory, path),
                          target.join(record.directory, path))
            if record.records is not None:  # written once: the mirror's copy, before its manifest
                copy_file(self.source.join(record.records.name), target.join(record.records.name))
        for segment in segments(self.source):  # metrics.jsonl, and its segments on S3
            files.write_atomic(target.join(segment.name), files.read_bytes(segment))
        files.write_atomic(target.join(MANIFEST_NAME), encoding.to_json(manifest).encode())
        kept = {r.directory for r in manifest.checkpoints}
        for name in present - kept:
            if is_checkpoint_dirname(name):
                files.delete_dir(target.join(name))


def _paths_of(source: Location, record: CheckpointRecord) -> list[str]:
    """What to copy of a checkpoint: its files, and where its node leaders wrote its records,
    their parts (read back here from the source, whatever the record in hand holds)."""
    if record.records is None or not record.records.parts:
        return [f.path for f in record.files]
    stored = read_records(record.records, lambda name: files.read_bytes(source.join(name)),
                          source.display, is_safe_relpath)
    parts = files.list_files(source.join(record.directory, PARTS_DIR))
    return [f.path for f in stored] + [f"{PARTS_DIR}/{name}" for name, _ in parts]


def export(source: Location, record: CheckpointRecord, target: Location) -> int:
    """Copy ``record``'s files from ``source`` to ``target``; raise if any differs from the
    manifest (the partial copy of that file is removed). Returns the bytes copied. A target
    in an experiment is refused before anything is written: the copy would truncate the very
    files it reads, or write into another run's checkpoints."""
    refuse_target(source, target)
    if record.damaged is not None:
        raise CheckpointError(f"{record.directory} cannot be exported: {record.damaged}")
    with progress(record.size, f"exporting {record.directory}") as bar:
        for f in record.files:
            destination = target.join(f.path)
            size, digest = copy_file(source.join(f.path), destination, bar.update,
                                     algorithm_of(f.checksum))
            if (size, digest) != (f.size, f.checksum):
                files.delete_file(destination)
                raise CheckpointError(
                    f"{source.join(f.path).display} does not match the manifest (size {size} vs "
                    f"{f.size}, checksum {short(digest)} vs {short(f.checksum)}); the export stopped. "
                    "Run hpckit verify on the experiment, and export another checkpoint.")
    return record.size


def refuse_target(checkpoint: Location, target: Location) -> None:
    """An export never writes into the experiment it reads, nor, on local storage, into any
    experiment."""
    experiment = checkpoint.path.rsplit("/", 1)[0]
    same_storage = checkpoint.is_local == target.is_local
    inside = same_storage and (target.path == experiment or target.path.startswith(f"{experiment}/"))
    if inside or (target.is_local and ownership.in_experiment(target.path)):
        which = "the one exported from" if inside else "a manifest.json above it"
        raise CheckpointError(
            f"{target.display} lies inside an experiment ({which}); hpckit export writes only "
            "outside every experiment: give a directory of its own, such as ./exported")
