"""Storage locations: a directory as a ``(pyarrow filesystem, path)`` pair, as in Ray.

``path`` is a path on ``filesystem`` without scheme or query: an absolute path locally,
``bucket/sub-path/name`` on S3. ``display`` is computed apart from it, for logs and
messages: the URI the user gave with its secrets redacted. Joining paths never touches the
display text: it is rebuilt from its prefix, the path and its query.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow
import pyarrow.fs

from hpckit.errors import ConfigError, StorageError
from hpckit.storage import s3
from hpckit.storage.uris import redact, redact_uri


@dataclass(frozen=True)
class Location:
    """A directory or file on some pyarrow filesystem, with a display form free of secrets."""

    filesystem: pyarrow.fs.FileSystem
    path: str
    display_prefix: str = ""
    display_query: str = ""

    @property
    def display(self) -> str:
        query = f"?{self.display_query}" if self.display_query else ""
        return f"{self.display_prefix}{self.path}{query}"

    def join(self, *parts: str) -> Location:
        return Location(self.filesystem, posixpath.join(self.path, *parts), self.display_prefix,
                        self.display_query)

    @property
    def parent(self) -> Location:
        return Location(self.filesystem, posixpath.dirname(self.path.rstrip("/")),
                        self.display_prefix, self.display_query)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pyarrow.fs.LocalFileSystem)


def local(path: str) -> Location:
    return Location(pyarrow.fs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path)))


def resolve(path: str | os.PathLike[str], filesystem: pyarrow.fs.FileSystem | None = None) -> Location:
    """Turn a user's storage path (and optional filesystem) into a :class:`Location`."""
    text = os.fspath(path)
    if filesystem is not None:
        return _on_filesystem(text, filesystem)
    if "://" not in text:
        return local(text)
    s3.without_own_options(text)  # hpckit's S3 options on another scheme are an error
    try:
        fs, inner = (s3.filesystem(text) if text.lower().startswith("s3://")
                     else pyarrow.fs.FileSystem.from_uri(text))
    except ConfigError:
        raise
    except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, ValueError, OSError) as exc:
        raise StorageError(
            f"cannot open storage {redact(text)!r}: {redact(str(exc))}. Use a local path, file://, "
            "s3://bucket/prefix?endpoint_override=host:port&scheme=http, or another pyarrow URI."
        ) from None
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return Location(fs, inner)
    inner = inner.rstrip("/")
    if not inner.strip("/"):
        raise ConfigError(f"storage {redact(text)!r} names no bucket or directory; use e.g. "
                          "s3://bucket/prefix?endpoint_override=host:port&scheme=http.")
    base, _, query = redact_uri(s3.without_own_options(text)).partition("?")
    base = unquote(base.rstrip("/"))
    prefix = base[: -len(inner)] if base.endswith(inner) else f"{base.split('://', 1)[0]}://"
    return Location(fs, inner, prefix, query)


def _on_filesystem(text: str, filesystem: pyarrow.fs.FileSystem) -> Location:
    if "://" in text:
        raise ConfigError(
            f"storage path {redact(text)!r} has a scheme, but a filesystem object is given: "
            "pass the path inside that filesystem, e.g. 'bucket/runs'.")
    clean = text.rstrip("/") or "/"
    if isinstance(filesystem, pyarrow.fs.LocalFileSystem):
        return Location(filesystem, clean)
    return Location(filesystem, clean, f"{filesystem.type_name}:")
