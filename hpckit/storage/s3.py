"""S3 filesystems built from ``s3://`` URIs, with timeouts and retries that bound how long a
rank waits on a dead server.

pyarrow's own URI parser cannot take timeouts, retries or a session token, so the URI is
parsed here and the filesystem constructed directly with every option.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow.fs

from hpckit import settings
from hpckit.errors import ConfigError
from hpckit.storage.uris import redact, split_query, with_query

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


def filesystem(uri: str) -> tuple[pyarrow.fs.S3FileSystem, str]:
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
