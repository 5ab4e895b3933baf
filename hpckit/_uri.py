"""Storage locations: parse a path/URI into (pyarrow filesystem, path), and redact secrets."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pyarrow.fs

from hpckit.errors import ConfigError, StorageError

_SECRET_QUERY = re.compile(r"secret|token|password|passwd|credential|signature|session|key", re.I)
_NOT_SECRET_QUERY = {"endpoint_override", "region", "scheme"}
REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``."""
    return _URI_IN_TEXT.sub(lambda m: _redact_uri(m.group(0)), text)


_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _redact_uri(uri: str) -> str:
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if _secret_key(k) else v) for k, v in pairs], safe="/:*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def restore_credentials(text: str, source: str) -> str:
    """Put ``source``'s userinfo back into redacted URIs in ``text`` that name the same host
    or bucket: the manifest records commands without secrets, and `hpckit resume` gets them
    again from the URI the user typed."""
    parts = urlsplit(source) if "://" in source else None
    if parts is None or "@" not in parts.netloc:
        return text
    userinfo, host = parts.netloc.rsplit("@", 1)
    return text.replace(f"{parts.scheme}://{REDACTED}@{host}", f"{parts.scheme}://{userinfo}@{host}")


def _secret_key(key: str) -> bool:
    return key not in _NOT_SECRET_QUERY and bool(_SECRET_QUERY.search(key))


@dataclass(frozen=True)
class Location:
    """A directory on some pyarrow filesystem, with a display form free of secrets."""

    filesystem: pyarrow.fs.FileSystem
    path: str
    display: str

    def join(self, *parts: str) -> Location:
        path = posixpath.join(self.path, *parts)
        return Location(self.filesystem, path, _join_display(self.display, parts))

    @property
    def parent(self) -> Location:
        base, sep, query = self.display.partition("?")
        return Location(self.filesystem, posixpath.dirname(self.path.rstrip("/")),
                        f"{posixpath.dirname(base.rstrip('/'))}{sep}{query}")

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pyarrow.fs.LocalFileSystem)


def _join_display(display: str, parts: tuple[str, ...]) -> str:
    base, sep, query = display.partition("?")
    joined = posixpath.join(base, *parts)
    return f"{joined}{sep}{query}"


def parent(path: str) -> tuple[str, str]:
    """Split a path or URI into (its parent, as given, query kept; its last component)."""
    if "://" not in path:
        local = os.path.abspath(os.path.expanduser(path))
        return os.path.dirname(local), os.path.basename(local)
    base, sep, query = path.partition("?")
    head, _, name = base.rstrip("/").rpartition("/")
    if not name or head.endswith(":/"):
        raise ConfigError(f"{redact(path)!r} has no parent directory to hold it as an experiment.")
    return f"{head}{sep}{query}", name


def resolve(path: str | os.PathLike[str], filesystem: pyarrow.fs.FileSystem | None = None) -> Location:
    """Turn a user's storage path (and optional filesystem) into a :class:`Location`."""
    text = os.fspath(path)
    if filesystem is not None:
        if "://" in text:
            raise ConfigError(
                f"storage path {redact(text)!r} has a scheme, but a filesystem object is given: "
                "pass the path inside that filesystem, e.g. 'bucket/runs'.")
        clean = text.rstrip("/") or "/"
        if isinstance(filesystem, pyarrow.fs.LocalFileSystem):
            return Location(filesystem, clean, clean)
        return Location(filesystem, clean, f"{filesystem.type_name}:{clean}")
    if "://" not in text:
        local = os.path.abspath(os.path.expanduser(text))
        return Location(pyarrow.fs.LocalFileSystem(), local, local)
    try:
        fs, inner = pyarrow.fs.FileSystem.from_uri(text)
    except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, ValueError, OSError) as exc:
        raise StorageError(
            f"cannot open storage {redact(text)!r}: {redact(str(exc))}. Use a local path, file://, "
            "s3://bucket/prefix?endpoint_override=host:port&scheme=http, or another pyarrow URI."
        ) from None
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return Location(fs, inner, inner)
    if not inner.strip("/"):
        raise ConfigError(f"storage {redact(text)!r} names no bucket or directory; use e.g. "
                          "s3://bucket/prefix?endpoint_override=host:port&scheme=http.")
    base, sep, query = _redact_uri(text).partition("?")
    return Location(fs, inner.rstrip("/"), f"{base.rstrip('/')}{sep}{query}")
