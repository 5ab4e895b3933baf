"""Storage paths and URIs: resolving, parents, redaction and the credentials kept."""

from __future__ import annotations


import pytest

from hpckit.errors import ConfigError, StorageError
from hpckit.storage.location import resolve
from hpckit.storage.uris import parent, redact, restore_credentials

pytestmark = pytest.mark.quick


@pytest.mark.parametrize("uri,redacted", [
    ("s3://AKIA:SECRET@bucket/p?endpoint_override=http://h:9000",
     "s3://***@bucket/p?endpoint_override=http://h:9000"),
    ("s3://bucket/p?session_token=abc&region=us", "s3://bucket/p?session_token=***&region=us"),
    ("see s3://k:s@b/x for details", "see s3://***@b/x for details"),
    ("/plain/path", "/plain/path"),
])
def test_redaction(uri, redacted):
    assert redact(uri) == redacted


def test_credentials_are_restored_only_for_the_same_bucket():
    source = "s3://AK:SK@bucket/runs/exp?endpoint_override=h:1"
    assert (restore_credentials("--storage=s3://***@bucket/runs?x=1", source)
            == "--storage=s3://AK:SK@bucket/runs?x=1")
    assert restore_credentials("s3://***@other/runs", source) == "s3://***@other/runs"
    assert restore_credentials("s3://***@bucket/x", "/local/exp") == "s3://***@bucket/x"


def test_resolve_local_paths_and_file_uris(tmp_path):
    assert resolve(str(tmp_path)).path == str(tmp_path)
    assert resolve(f"file://{tmp_path}").path == str(tmp_path)
    assert resolve("~/x").path.endswith("/x") and not resolve("~/x").path.startswith("~")


@pytest.mark.parametrize("given,expected", [
    ("/runs/exp", ("/runs", "exp")),
    ("/runs/exp/", ("/runs", "exp")),
    ("s3://k:s@bucket/runs/exp?endpoint_override=h:9000&scheme=http",
     ("s3://k:s@bucket/runs?endpoint_override=h:9000&scheme=http", "exp")),
    ("s3://bucket/exp", ("s3://bucket", "exp")),
])
def test_parent_keeps_the_uri_as_given(given, expected):
    assert parent(given) == expected


def test_resolve_unknown_scheme_is_a_clear_error():
    with pytest.raises(StorageError, match=r"cannot open storage 'nope://\*\*\*@b/x'") as info:
        resolve("nope://k:secret@b/x")
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("uri,error,fragment", [
    ("s3://k:s@b/x?endpoint_override=h:1&retries=0", ConfigError, "retries='0'"),
    ("s3://k:s@b/x?endpoint_override=h:1&connect_timeout=soon", ConfigError, "connect_timeout='soon'"),
    ("file:///tmp/x?retries=3", ConfigError, "apply to s3:// only"),
    ("s3:///runs", ConfigError, "names no bucket"),
    ("s3://b/x?endpoint_override=h:1&session_token=t", ConfigError, "no key and secret"),
    ("s3://k:s@b/x?endpoint_override=h:1&colour=blue", ConfigError, "unknown option(s) colour"),
])
def test_bad_storage_options_are_config_errors_naming_them(uri, error, fragment):
    with pytest.raises(error) as info:
        resolve(uri)
    assert fragment in str(info.value) and ":s@" not in str(info.value)


def test_s3_uris_decode_their_keys_and_keep_tls_options():
    location = resolve("s3://k:s@b/my%20runs?endpoint_override=h:1&scheme=http"
                       "&tls_ca_file_path=/etc/ca.pem")
    assert location.path == "b/my runs" and location.display.startswith("s3://***@b/my runs?")
    assert location.join("exp").path == "b/my runs/exp"


def test_a_uri_without_credentials_is_recorded_as_typed():
    """hpckit resume re-ran ``--uri sqlite:////abs/mlflow.db`` as ``sqlite://abs/...``."""
    assert redact("--uri sqlite:////tmp/x/mlflow.db") == "--uri sqlite:////tmp/x/mlflow.db"
    assert redact("s3://bucket//a?region=x") == "s3://bucket//a?region=x"
    assert redact("s3://key:secret@bucket/a") == "s3://***@bucket/a"
