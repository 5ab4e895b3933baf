"""Copying a committed checkpoint elsewhere, checking every byte against the manifest."""

from __future__ import annotations

import posixpath
import sys
from collections.abc import Callable
from typing import Any

import click

from hpckit import _storage
from hpckit._manifest import CheckpointRecord
from hpckit._uri import Location
from hpckit.errors import CheckpointError

PROGRESS_FROM = 64 << 20  # a bar only for transfers that take a while, and only on a terminal


def progress(total: int, label: str) -> Any:
    """A progress bar for transfers of at least PROGRESS_FROM bytes, drawn on a terminal only
    (batch logs stay quiet)."""
    show = total >= PROGRESS_FROM and sys.stderr.isatty()
    return click.progressbar(length=total, label=label, file=sys.stderr, hidden=not show)


def export(source: Location, record: CheckpointRecord, target: Location) -> int:
    """Copy ``record``'s files from ``source`` to ``target``; raise if any differs from the
    manifest (the partial copy of that file is removed). Returns the bytes copied."""
    total = record.size
    with progress(total, f"exporting {record.directory}") as bar:
        for f in record.files:
            destination = target.join(f.path)
            size, digest = _copy(source.join(f.path), destination, bar.update)
            if (size, digest) != (f.size, f.sha256):
                _storage.delete_file(destination)
                raise CheckpointError(
                    f"{source.join(f.path).display} does not match the manifest (size {size} vs "
                    f"{f.size}, sha256 {digest[:12]}... vs {f.sha256[:12]}...); the export stopped. "
                    "Run hpckit verify on the experiment, and export another checkpoint.")
    return total


def _copy(source: Location, target: Location, advance: Callable[[int], Any]) -> tuple[int, str]:
    with _storage.errors_named(target, "write"):
        target.filesystem.create_dir(posixpath.dirname(target.path), recursive=True)
        with _storage.errors_named(source, "read"), \
                source.filesystem.open_input_stream(source.path) as src, \
                target.filesystem.open_output_stream(target.path) as dst:
            return _storage.pipe_hashed(src, dst, advance)
