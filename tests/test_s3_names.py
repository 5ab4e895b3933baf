"""Every way to name S3 storage, against the real server: credentials from the environment,
from AWS config files or from the URI; a pyarrow filesystem object; an fsspec filesystem
(s3fs) wrapped for pyarrow; and a Checkpoint URI on its own."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow.fs
import pytest
from conftest import HERE, mpiexec
from support.s3_server import ACCESS_KEY, BUCKET, SECRET_KEY

import hpckit
from hpckit import Checkpoint, DataParallelTrainer, Result, RunConfig

SHARDED = HERE / "ranks" / "sharded.py"
NO_AMBIENT_CREDENTIALS = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
                          "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_ACCESS_KEY_ID": "",
                          "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": ""}


def plain_uri(s3, path: str) -> str:
    """An s3:// URI without credentials: they must come from elsewhere."""
    return f"s3://{BUCKET}/{path}?endpoint_override={s3.endpoint}&scheme=http&region=us-east-1"


def committed(s3, name: str) -> list[str]:
    listing = s3.filesystem().get_file_info(pyarrow.fs.FileSelector(f"{BUCKET}/{name}"))
    return sorted(i.base_name for i in listing if i.base_name.startswith("checkpoint_"))


def test_credentials_from_environment_variables(s3):
    env = {**NO_AMBIENT_CREDENTIALS, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    out = mpiexec(2, "--storage", plain_uri(s3, "from-env"), "--epochs", "2", script=SHARDED,
                  env=env, timeout=90)
    assert committed(s3, "from-env/exp") == ["checkpoint_000000", "checkpoint_000001"]
    assert SECRET_KEY not in out.output


def test_credentials_from_an_aws_credentials_file_and_profile(s3, tmp_path):
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
                           f"[hpckit]\naws_access_key_id = {ACCESS_KEY}\n"
                           f"aws_secret_access_key = {SECRET_KEY}\n")
    env = {**NO_AMBIENT_CREDENTIALS, "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
           "AWS_PROFILE": "hpckit"}
    mpiexec(2, "--storage", plain_uri(s3, "from-file"), "--epochs", "2", script=SHARDED, env=env,
            timeout=90)
    assert committed(s3, "from-file/exp") == ["checkpoint_000000", "checkpoint_000001"]


def loop() -> None:
    start = 0
    if checkpoint := hpckit.get_checkpoint():
        with checkpoint.as_directory() as d:
            start = int(np.load(os.path.join(d, "w.npy"))[0]) + 1
    for step in range(start, start + 2):
        with tempfile.TemporaryDirectory() as d:
            np.save(os.path.join(d, "w.npy"), np.full(1000, step))
            hpckit.report({"step": step}, checkpoint=Checkpoint.from_directory(d))


def run_twice_on(filesystem: pyarrow.fs.FileSystem, path: str) -> Result:
    """Two runs on the same experiment: the second resumes from the first's checkpoint."""
    config = RunConfig(name="objfs", storage_path=path, storage_filesystem=filesystem)
    DataParallelTrainer(loop, run_config=config).fit()
    return DataParallelTrainer(loop, run_config=config).fit()


def check_result(result: Result, filesystem: pyarrow.fs.FileSystem, path: str) -> None:
    assert result.metrics_dataframe.column("step").to_pylist() == [0, 1, 2, 3]
    assert result.checkpoint is not None and result.checkpoint.path == f"{path}/objfs/checkpoint_000003"
    again = Result.from_path(f"{path}/objfs", storage_filesystem=filesystem)
    assert again.checkpoint == result.checkpoint
    with again.checkpoint.as_directory() as d:
        assert np.load(os.path.join(d, "w.npy"))[0] == 3


def test_a_pyarrow_filesystem_object(s3):
    fs = s3.filesystem()
    check_result(run_twice_on(fs, f"{BUCKET}/pyarrow-object"), fs, f"{BUCKET}/pyarrow-object")


def test_an_fsspec_filesystem_wrapped_for_pyarrow(s3):
    s3fs = pytest.importorskip("s3fs")
    fsspec_fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY,
                                  client_kwargs={"endpoint_url": f"http://{s3.endpoint}"})
    fs = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fsspec_fs))
    check_result(run_twice_on(fs, f"{BUCKET}/fsspec"), fs, f"{BUCKET}/fsspec")


def test_a_checkpoint_uri_on_its_own(s3):
    fs = s3.filesystem()
    run_twice_on(fs, f"{BUCKET}/alone")
    checkpoint = Checkpoint(s3.uri("alone/objfs/checkpoint_000002"))
    assert "***@" in repr(checkpoint) and SECRET_KEY not in repr(checkpoint)
    with checkpoint.as_directory() as d:
        assert np.load(os.path.join(d, "w.npy"))[0] == 2
    target = checkpoint.to_directory(tempfile.mkdtemp())
    assert os.listdir(target) == ["w.npy"]


def test_hpckit_storage_names_the_default(s3):
    env = {"HPCKIT_STORAGE": s3.uri("from-default")}
    mpiexec(2, "--epochs", "1", script=SHARDED, env=env, timeout=90)
    assert committed(s3, "from-default/exp") == ["checkpoint_000000"]


def test_no_secret_reaches_anything_hpckit_writes_or_prints(s3, tmp_path):
    """Everything stored under the experiment, its mirror, its artifacts and the output of
    every rank, grepped for the secret."""
    uri = s3.uri("secrets")
    out = mpiexec(3, "--storage", uri, "--epochs", "3", "--artifacts", "all", "--mirror",
                  str(tmp_path / "mirror"), "--sync-period", "0", script=SHARDED, timeout=120)
    fs = s3.filesystem()
    stored = [i.path for i in fs.get_file_info(pyarrow.fs.FileSelector(f"{BUCKET}/secrets",
                                                                         recursive=True))
              if i.type == pyarrow.fs.FileType.File]
    assert any(p.endswith("manifest.json") for p in stored) and any("artifacts" in p for p in stored)
    texts = {p: fs.open_input_stream(p).read() for p in stored}
    texts.update({str(p): p.read_bytes() for p in (tmp_path / "mirror").rglob("*") if p.is_file()})
    texts["output"] = out.output.encode()
    leaked = [where for where, data in texts.items() if SECRET_KEY.encode() in data]
    assert not leaked, f"the secret leaked into {leaked}"
    assert "***@" in out.output and "***@" in texts[f"{BUCKET}/secrets/exp/manifest.json"].decode()


def test_a_session_token_in_the_uri_is_used_and_never_shown():
    from hpckit.storage.location import resolve
    from hpckit.storage.uris import redact

    uri = "s3://AK:SK@bucket/p?endpoint_override=127.0.0.1:1&scheme=http&session_token=tok-secret-42"
    location = resolve(uri)
    assert location.filesystem.__reduce__()[1][0]["session_token"] == "tok-secret-42"
    assert "tok-secret-42" not in location.display + repr(Checkpoint(uri)) + redact(uri)
