"""Storage locations: a directory as a ``(pyarrow filesystem, path)`` pair, as in Ray.

``path`` is a path on ``filesystem`` without scheme or query: an absolute path locally,
``bucket/sub-path/name`` on S3. ``display`` is computed apart from it, for logs and
messages: the URI the user gave with its secrets redacted. Joining paths never touches the
display text: it is rebuilt from its prefix, the path and its query.

S3 filesystems built from ``s3://`` URIs, with timeouts and retries that bound how long a
rank waits on a dead server.

pyarrow's own URI parser cannot take timeouts, retries or a session token, so the URI is
parsed here and the filesystem constructed directly with every option.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow
import pyarrow.fs

from hpckit import settings
from hpckit.errors import ConfigError, StorageError
from hpckit.storage.uris import redact, redact_uri, split_query, with_query


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
    without_own_options(text)  # hpckit's S3 options on another scheme are an error
    try:
        fs, inner = (s3_filesystem(text) if text.lower().startswith("s3://")
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
    base, _, query = redact_uri(without_own_options(text)).partition("?")
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


# hpckit's own options: seconds to connect, seconds per request, attempts per request (with
# exponential backoff); session_token for temporary credentials.
DEFAULTS: dict[str, float] = {"connect_timeout": 10.0, "request_timeout": 60.0, "retries": 5}
_OWN = (*DEFAULTS, "session_token")
_PYARROW = ("region", "scheme", "endpoint_override", "allow_bucket_creation",
            "allow_bucket_deletion", "tls_ca_file_path")
_BOOLEAN = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def without_own_options(uri: str) -> str:
    """The URI less hpckit's own query options (they are not part of where the data is)."""
    bare, pairs = split_query(uri)
    own = [(k, v) for k, v in pairs if k in _OWN]
    if own and not uri.lower().startswith("s3://"):
        raise ConfigError(f"storage {redact(uri)!r}: {', '.join(k for k, _ in own)} apply to "
                          "s3:// only.")
    return with_query(uri, [(k, v) for k, v in pairs if k not in _OWN]) if own else uri


def s3_filesystem(uri: str) -> tuple[pyarrow.fs.S3FileSystem, str]:
    """The filesystem and the ``bucket/key`` path an ``s3://`` URI names."""
    parts = urlsplit(uri)
    userinfo, _, bucket = parts.netloc.rpartition("@")
    _, pairs = split_query(uri)
    options = dict(pairs)
    unknown = sorted(set(options) - set(_OWN) - set(_PYARROW))
    if unknown:
        raise ConfigError(f"storage {redact(uri)!r} has unknown option(s) {', '.join(unknown)}; "
                          f"accepted: {', '.join(_PYARROW + _OWN)}.")
    if not bucket:
        raise ConfigError(f"storage {redact(uri)!r} names no bucket; use e.g. "
                          "s3://bucket/prefix?endpoint_override=host:port&scheme=http.")
    if options.get("session_token") and not userinfo:
        raise ConfigError(f"storage {redact(uri)!r} has a session_token but no key and secret; "
                          "give them too: s3://KEY:SECRET@bucket/...&session_token=...")
    kwargs = _credentials(userinfo, options.get("session_token"))
    kwargs.update(_connection(options, bucket, uri))
    return pyarrow.fs.S3FileSystem(**kwargs), unquote(f"{bucket}{parts.path}")


def _credentials(userinfo: str, session_token: str | None) -> dict[str, Any]:
    if not userinfo:
        return {}
    key, _, secret = userinfo.partition(":")
    kwargs = {"access_key": unquote(key), "secret_key": unquote(secret)}
    if session_token:
        kwargs["session_token"] = session_token
    return kwargs


def _connection(options: dict[str, str], bucket: str, uri: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {k: options[k] for k in ("region", "scheme", "endpoint_override",
                                                      "tls_ca_file_path") if k in options}
    for key in ("allow_bucket_creation", "allow_bucket_deletion"):
        if key in options:
            if options[key].lower() not in _BOOLEAN:
                raise ConfigError(f"storage option {key}={options[key]!r} in {redact(uri)!r} must "
                                  "be true or false.")
            kwargs[key] = _BOOLEAN[options[key].lower()]
    # As pyarrow's URI parser does: ask AWS for the bucket's region only when no other
    # endpoint is named, in the URI or in AWS's own variables.
    current = settings.current()
    if "region" not in kwargs and "endpoint_override" not in kwargs \
            and not (current.aws_endpoint or current.aws_endpoint_s3):
        kwargs["region"] = pyarrow.fs.resolve_s3_region(bucket)
    numbers = {key: _number(key, options[key], uri) if key in options else default
               for key, default in DEFAULTS.items()}
    kwargs.update(connect_timeout=numbers["connect_timeout"],
                  request_timeout=numbers["request_timeout"],
                  retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(
                      max_attempts=int(numbers["retries"])))
    return kwargs


def _number(key: str, value: str, uri: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if key == "retries" and not (number >= 1 and number.is_integer()):
        raise ConfigError(f"storage option retries={value!r} in {redact(uri)!r} must be a whole "
                          f"number >= 1 (default {DEFAULTS[key]:g}).")
    if not number > 0:
        raise ConfigError(f"storage option {key}={value!r} in {redact(uri)!r} must be a number of "
                          f"seconds > 0 (default {DEFAULTS[key]:g}).")
    return number
