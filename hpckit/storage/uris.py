"""Storage URIs as text: redacting their secrets, and the few string operations on URIs that
must keep what the user typed (credentials included) for a process started later."""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from hpckit.errors import ConfigError

_SECRET_QUERY = re.compile(r"secret|token|password|passwd|credential|signature|session|key", re.I)
_NOT_SECRET_QUERY = {"endpoint_override", "region", "scheme"}
REDACTED = "***"
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>,.;:)]")


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``."""
    return _URI_IN_TEXT.sub(lambda m: redact_uri(m.group(0)), text)


def redact_uri(uri: str) -> str:
    """``uri`` with its credentials replaced by ``***``; a URI without any is returned as it
    is (taken apart and put together again, ``sqlite:////abs/path`` would lose a slash)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if netloc == parts.netloc and not any(_secret_key(k) for k, _ in pairs):
        return uri
    query = urlencode([(k, REDACTED if _secret_key(k) else v) for k, v in pairs], safe="/:*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _secret_key(key: str) -> bool:
    return key not in _NOT_SECRET_QUERY and bool(_SECRET_QUERY.search(key))


def restore_credentials(text: str, source: str) -> str:
    """Put ``source``'s userinfo back into redacted URIs in ``text`` that name the same host
    or bucket: the manifest records commands without secrets, and `hpckit resume` gets them
    again from the URI the user typed."""
    parts = urlsplit(source) if "://" in source else None
    if parts is None or "@" not in parts.netloc:
        return text
    userinfo, host = parts.netloc.rsplit("@", 1)
    return text.replace(f"{parts.scheme}://{REDACTED}@{host}", f"{parts.scheme}://{userinfo}@{host}")


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


def join(uri: str, name: str) -> str:
    """``{uri}/{name}``, keeping the URI's query after the path."""
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{name}{sep}{query}"


def split_query(uri: str) -> tuple[str, list[tuple[str, str]]]:
    """The URI without its query, and the query's pairs."""
    parts = urlsplit(uri)
    bare = urlunsplit((parts.scheme, parts.netloc, parts.path, "", parts.fragment))
    return bare, parse_qsl(parts.query, keep_blank_values=True)


def with_query(uri: str, pairs: list[tuple[str, str]]) -> str:
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(pairs, safe="/:"),
                       parts.fragment))
