"""One contract for every storage backend: the same tests on a local directory and on S3.

These are the primitives the commit protocol is built on; a backend that passes them can
hold experiments."""

from __future__ import annotations

import os

import pyarrow.fs
import pytest
import xxhash

from hpckit.errors import StorageError
from hpckit.storage import copy as _copy
from hpckit.storage import files as _storage
from hpckit.storage.copy import checksum_of
from hpckit.storage.location import resolve


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return resolve(str(tmp_path / "store"))
    return resolve(request.getfixturevalue("s3").uri(f"contract-{tmp_path.name}"))


def test_atomic_write_replaces_whole_and_reads_back(root):
    target = root.join("manifest.json")
    _storage.make_dir(root)
    _storage.write_atomic(target, b"first")
    _storage.write_atomic(target, b"second, longer")
    assert _storage.read_bytes(target) == b"second, longer"
    assert [name for name, _ in _storage.list_files(root)] == ["manifest.json"]  # no temp left


def test_append_grows_the_file_on_every_backend(root):
    target = root.join("metrics.jsonl")
    _storage.make_dir(root)
    _storage.append_text(target, "a\n", lambda: "a\n")
    _storage.append_text(target, "b\n", lambda: "a\nb\n")
    assert _storage.read_bytes(target) == b"a\nb\n"


def test_persist_hashes_what_it_stores_and_lists_and_downloads(root, tmp_path):
    source = tmp_path / "shard.pt"
    data = os.urandom(3 << 20)
    source.write_bytes(data)
    size, digest = _copy.persist_file(str(source), root.join("checkpoint_000000/sub/shard.pt"))
    assert (size, digest) == (len(data), checksum_of(data))
    assert digest == "xxh3-128:" + xxhash.xxh3_128(data).hexdigest()
    assert _storage.list_files(root.join("checkpoint_000000")) == [("sub/shard.pt", len(data))]
    _copy.download_dir(root.join("checkpoint_000000"), str(tmp_path / "down"))
    assert (tmp_path / "down" / "sub" / "shard.pt").read_bytes() == data


def test_delete_and_file_types(root, tmp_path):
    source = tmp_path / "f"
    source.write_bytes(b"x")
    _copy.persist_file(str(source), root.join("d/f"))
    assert _storage.file_type(root.join("d/f")) == pyarrow.fs.FileType.File
    assert _storage.file_type(root.join("nothing")) == pyarrow.fs.FileType.NotFound
    _storage.delete_dir(root.join("d"))
    _storage.delete_dir(root.join("d"))  # deleting what is gone is not an error
    assert _storage.list_files(root) == []


@pytest.mark.parametrize("names", [["a/x1", "a/x2"], ["a/x", "a/b/x1", "a/b/x2"],
                                   ["a/b/c/x1", "a/b/c/x2", "a/b/d/x1", "a/b/d/x2"], ["a/b/c/x"],
                                   ["a/b/c/x", "a/b/d/x"], ["a/b/c/x", "a/b/d/x", "a/y"]])
def test_a_deleted_directory_is_gone_whatever_folders_it_held(root, names):
    """SeaweedFS kept a folder of two entries or more (objects or folders), deleted with its
    directory, as an empty folder that no request removed, so the directory stayed listed: a
    checkpoint evicted with its records' parts (``.hpckit-records/``) stayed as a leftover."""
    for name in names:
        if root.is_local:  # object storage has no folders to make (a marker would be one more)
            _storage.make_dir(root.join(name.rsplit("/", 1)[0]))
        _storage.write_atomic(root.join(name), b"x")
    _storage.delete_dir(root.join("a"))
    assert [i.base_name for i in _storage.list_dir(root)] == []
    assert _storage.file_type(root.join("a")) == pyarrow.fs.FileType.NotFound


def test_errors_name_the_location_without_secrets(root):
    with pytest.raises(StorageError) as info:
        _storage.read_bytes(root.join("missing.json"))
    assert "missing.json" in str(info.value) and "secret" not in str(info.value)
