"""Per-file checksums, named by their algorithm.

A checksum is one string, ``"<algorithm>:<hex>"``, so that a manifest, a comparison or an
error message never separates the value from how it was computed. New files get XXH3-128
(about 10 GB/s on one core, against SHA-256's 1.2 GB/s: the hash no longer competes with
training for the CPU; both release the GIL). The checksum guards against damage (a torn
write, a flipped byte, a truncated upload), not against someone forging a file, which a
checkpoint directory's permissions do. Manifests written before it recorded a bare SHA-256
in a ``sha256`` field; they are read as ``"sha256:<hex>"`` and verify as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import xxhash

ALGORITHM = "xxh3-128"
SHA256 = "sha256"
_NEW: dict[str, Callable[[], Any]] = {ALGORITHM: xxhash.xxh3_128, SHA256: hashlib.sha256}
ALGORITHMS = tuple(_NEW)


class Checksum:
    """A checksum being computed: feed it bytes with :meth:`update`, read :attr:`value`."""

    def __init__(self, algorithm: str = ALGORITHM) -> None:
        if algorithm not in _NEW:
            raise ValueError(f"unknown checksum algorithm {algorithm!r}; hpckit knows "
                             f"{', '.join(ALGORITHMS)}")
        self.algorithm = algorithm
        self._hash = _NEW[algorithm]()

    def update(self, data: Any) -> None:
        self._hash.update(data)

    @property
    def value(self) -> str:
        return f"{self.algorithm}:{self._hash.hexdigest()}"


def checksum_of(data: Any, algorithm: str = ALGORITHM) -> str:
    """The checksum of bytes (or any buffer) already in memory."""
    running = Checksum(algorithm)
    running.update(data)
    return running.value


def algorithm_of(checksum: str) -> str:
    """The algorithm a checksum was computed with ("xxh3-128", "sha256")."""
    return checksum.partition(":")[0]


def problem(checksum: str) -> str | None:
    """Why ``checksum`` is not one hpckit can verify, or None when it is."""
    algorithm, colon, digest = checksum.partition(":")
    if not colon or algorithm not in _NEW:
        return (f"{checksum[:40]!r} is not '<algorithm>:<hex>' with an algorithm this hpckit "
                f"knows ({', '.join(ALGORITHMS)}); a newer hpckit may have written it")
    if len(digest) != _NEW[algorithm]().digest_size * 2 or not _is_hex(digest):
        return f"{checksum[:40]!r} is not a {algorithm} digest in hex"
    return None


def short(checksum: str) -> str:
    """A checksum for a message: its algorithm and the first 12 hex digits."""
    algorithm, _, digest = checksum.partition(":")
    return f"{algorithm} {digest[:12]}..."


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
