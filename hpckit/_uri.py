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
# hpckit's own S3 options, taken out of the query before pyarrow parses the rest:
# seconds to connect, seconds per request, attempts per request (with exponential backoff).
S3_DEFAULTS = {"connect_timeout": 10.0, "request_timeout": 60.0, "retries": 5}
REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``."""
    return _URI_IN_TEXT.sub(lambda m: _redact_uri(m.group(0)), text)


_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>,.;:)]")


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
    text, options = _take_options(text)
    try:
        fs, inner = pyarrow.fs.FileSystem.from_uri(text)
        if isinstance(fs, pyarrow.fs.S3FileSystem):
            fs = _with_timeouts(fs, options)
        elif options:
            raise ConfigError(f"storage {redact(text)!r}: {', '.join(options)} apply to s3:// only.")
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


def _take_options(uri: str) -> tuple[str, dict[str, float | str]]:
    """Split hpckit's own options (:data:`S3_DEFAULTS`, and ``session_token`` for temporary
    credentials, which pyarrow's URIs lack) out of a URI's query."""
    parts = urlsplit(uri)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, float | str] = {}
    for key, value in pairs:
        if key == "session_token":
            options[key] = value
        elif key in S3_DEFAULTS:
            options[key] = _number(key, value, uri)
    rest = urlencode([(k, v) for k, v in pairs if k not in options], safe="/:")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), options


def _number(key: str, value: str, uri: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if key == "retries" and not (number >= 1 and number.is_integer()):
        raise ConfigError(f"storage option retries={value!r} in {redact(uri)!r} must be a whole "
                          f"number >= 1 (default {S3_DEFAULTS[key]}).")
    if not number > 0:
        raise ConfigError(f"storage option {key}={value!r} in {redact(uri)!r} must be a number of "
                          f"seconds > 0 (default {S3_DEFAULTS[key]}).")
    return number


def _with_timeouts(fs: pyarrow.fs.S3FileSystem, options: dict[str, float | str]
                   ) -> pyarrow.fs.S3FileSystem:
    """The same S3 filesystem with hpckit's timeouts and retries, so that a dead server
    fails a request after a bounded time instead of hanging a rank."""
    settings = {**S3_DEFAULTS, **options}
    kwargs = fs.__reduce__()[1][0]
    kwargs.update(connect_timeout=float(settings["connect_timeout"]),
                  request_timeout=float(settings["request_timeout"]))
    if "session_token" in settings:
        kwargs["session_token"] = settings["session_token"]
    retry = pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=int(settings["retries"]))
    return pyarrow.fs.S3FileSystem(**kwargs, retry_strategy=retry)
