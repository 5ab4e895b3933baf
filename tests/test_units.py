"""Pure pieces: metrics conversion, URI redaction, environment table."""

from __future__ import annotations

import math
import mmap
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hpckit.errors import ConfigError, MetricsError, StorageError
from hpckit.experiment.values import to_json_metrics
from hpckit.run.mpi.library import implementation, loaded_version, srun_plugin
from hpckit.settings import Settings
from hpckit.storage.location import resolve
from hpckit.storage.uris import parent, redact, restore_credentials

pytestmark = pytest.mark.quick


def test_metrics_conversion():
    out = to_json_metrics({"t": torch.tensor(1.5), "n": np.float32(2.0), "i": np.int64(3),
                           "nan": math.nan, "list": [torch.tensor([4])], "d": {"b": True}})
    assert out == {"t": 1.5, "n": 2.0, "i": 3, "nan": None, "list": [4], "d": {"b": True}}


def test_metrics_refuse_multi_element_tensors():
    with pytest.raises(MetricsError, match="metric 'w'"):
        to_json_metrics({"w": torch.ones(3)})


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


@pytest.mark.parametrize("environ,launcher,tasks", [
    ({}, None, None),
    ({"PMI_SIZE": "3", "PMI_RANK": "0"}, "mpiexec", 3),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "mpiexec", 2),
    ({"SLURM_STEP_NUM_TASKS": "4", "PMI_SIZE": "4"}, "srun", 4),
    ({"SLURM_STEP_NUM_TASKS": "2", "PMIX_RANK": "1"}, "srun", 2),  # srun --mpi=pmix
    ({"SLURM_STEP_NUM_TASKS": "1", "OMPI_COMM_WORLD_SIZE": "3", "PMIX_RANK": "0"}, "mpiexec", 3),
    ({"SLURM_STEP_NUM_TASKS": "3"}, "srun", 3),
    ({"SLURM_STEP_NUM_TASKS": "1", "PMI_SIZE": "2"}, "mpiexec", 2),
    ({"SLURM_JOB_ID": "7"}, None, None),
])
def test_launcher_detection(environ, launcher, tasks):
    env = Settings.read(environ)
    assert env.launcher == launcher and env.launched_tasks == tasks


@pytest.mark.parametrize("version,plugin", [
    ("MPICH Version:      4.3.2", "pmi2"),
    ("Open MPI v5.0.11, package: Open MPI root@build Distribution", "pmix"),
    ("Intel(R) MPI Library 2021.17 for Linux* OS", "pmi2"),
    ("MPI VERSION    : CRAY MPICH version 8.1.30.2", "cray_shasta"),
    ("Some other MPI 1.0", "pmi2"),  # not recognised: the default
])
def test_srun_plugin_follows_the_mpi_implementation(version, plugin):
    assert srun_plugin(version) == plugin


def test_the_loaded_mpi_is_asked_without_starting_mpi_here():
    version = loaded_version(sys.executable)
    assert implementation(version) == "MPICH" and ", package:" not in version, version
    out = subprocess.run([sys.executable, "-m", "hpckit", "doctor", "--srun-mpi"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "pmi2\n", out.stdout + out.stderr


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


def test_only_shared_memory_that_nothing_maps_is_removed():
    """The segments' times lie hours back: the other worker's leftover check removes the
    unmapped ``mpich_*`` made since its module began."""
    from hpckit.run.startup.shm import SHM_DIR, remove_unmapped

    prefix = f"mpich_shm_test{os.getpid()}"
    old, new, mapped = (Path(SHM_DIR, f"{prefix}{name}_0") for name in ("old", "new", "mapped"))
    pattern = [f"{SHM_DIR}/{prefix}*"]
    try:
        for segment, hours_ago in ((old, 4), (new, 2), (mapped, 2)):
            segment.write_bytes(b"\0" * mmap.PAGESIZE)
            os.utime(segment, (time.time() - hours_ago * 3600,) * 2)
        with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 0):
            assert remove_unmapped(pattern, since=time.time() - 3 * 3600) == [new.name]
            assert old.exists() and not new.exists()
            assert remove_unmapped(pattern) == [old.name]
        assert not old.exists() and mapped.exists()
    finally:
        for segment in (old, new, mapped):
            segment.unlink(missing_ok=True)


def test_a_named_semaphore_in_use_is_not_taken_for_a_killed_ranks():
    """glibc maps a semaphore under a temporary name, then links it to ``sem.mp-*``: a
    DataLoader's semaphore looks unmapped by name, and its workers open it by name later."""
    import _multiprocessing

    from hpckit.run.startup.shm import SHM_DIR, remove_unmapped

    name = f"/mp-hpckit-test-{os.getpid()}"  # as multiprocessing names it, without its tracker
    semaphore = _multiprocessing.SemLock(1, 1, 1, name, False)
    try:
        assert remove_unmapped([f"{SHM_DIR}/sem.{name[1:]}"]) == []
        assert Path(SHM_DIR, f"sem.{name[1:]}").exists()
    finally:
        _multiprocessing.sem_unlink(name)
        del semaphore


@pytest.mark.parametrize("face,name,package", [("lightning", "RayDDPStrategy", "lightning"),
                                               ("transformers", "prepare_trainer", "transformers")])
def test_a_missing_extra_is_named_with_its_install_command(face, name, package):
    """As on a machine without the extra: the package cannot be imported."""
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            f"import hpckit.{face}\n"
            f"try:\n    hpckit.{face}.{name}\nexcept ModuleNotFoundError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    clone = Path(__file__).resolve().parent.parent  # hpckit runs from this clone
    assert out.stdout.strip() == (f"hpckit.{face}.{name} needs {package}, which is not "
                                  f"installed: pip install -e '{clone}[{face}]'"), out.stderr


def test_an_extra_outside_a_clone_is_named_from_the_clone_it_came_from(monkeypatch):
    from hpckit.integrations import optional

    monkeypatch.setattr(optional, "hpckit_clone", lambda: None)
    assert optional.install_command("lightning") == (
        "pip install -e '.[lightning]' in the clone of hpckit that you installed it from")


def test_a_slurm_warning_after_the_run_is_ignored_through_the_interpreter_exit():
    """Caught early (at import hpckit), then handled by a run: afterwards the warning is
    ignored, not caught, since Python resets caught signals to their default (terminate)
    when it finalizes, and Slurm's warning may come while the rank exits."""
    import signal

    from hpckit.run.ending import stop

    before = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert stop.catch_early(signal.SIGUSR2)
        with stop.handling(signal.SIGUSR2):
            assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        with stop.handling(signal.SIGUSR1):
            pass
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, before)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_finalize_with_hydra_speaks_pmi_1_only_to_hydra(monkeypatch):
    """Slurm's PMI-2 also sets PMI_FD, and a job submitted from an mpiexec rank inherits
    hydra's MPI_LOCALRANKID: PMI-1's words go only where hydra's proxy holds the other end."""
    from hpckit.run.ending import pmi

    ours, theirs = socket.socketpair()  # this process at both ends: not hydra_pmi_proxy
    try:
        monkeypatch.setenv("PMI_FD", str(theirs.fileno()))
        monkeypatch.setenv("MPI_LOCALRANKID", "0")
        assert pmi.hydra_connection() is None
        assert not pmi.finalize_with_hydra()
        ours.setblocking(False)
        with pytest.raises(BlockingIOError):
            ours.recv(64)
        monkeypatch.setenv("PMI_FD", "not a number")
        assert pmi.hydra_connection() is None
    finally:
        ours.close()
        theirs.close()


def test_prepare_model_names_what_it_takes():
    from hpckit.integrations.torch.sharding import fully_sharded
    from hpckit.torch import prepare_model

    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match=r"parallel_strategy='zero'\): give 'ddp', 'fsdp' or None"):
        prepare_model(model, parallel_strategy="zero")
    with pytest.raises(ConfigError, match=r"\['find_unused_parameters'\] are DDP's keywords"):
        prepare_model(model, parallel_strategy="fsdp", find_unused_parameters=True)
    with pytest.raises(ConfigError, match=r"FSDP1's \['cpu_offload', 'sharding_strategy'\]; "
                                          r"give cpu_offload: offload_policy="):
        fully_sharded(model, torch.device("cpu"), {"sharding_strategy": 1, "cpu_offload": 2})
    assert prepare_model(model, move_to_device=False, parallel_strategy=None) is model


def test_validation_configs_say_what_is_wrong():
    from hpckit import ValidationConfig, ValidationTaskConfig

    with pytest.raises(ConfigError, match=r"timeout_s=0\) must be a number of seconds > 0"):
        ValidationTaskConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="must hold JSON values"):
        ValidationTaskConfig(fn_kwargs={"model": object()})
    with pytest.raises(ConfigError, match="must be a function"):
        ValidationConfig("validate")  # type: ignore[arg-type]
    config = ValidationConfig(len, ValidationTaskConfig({"a": 1, "b": 2}, timeout_s=5))
    assert config.task(True) == {"fn_kwargs": {"a": 1, "b": 2}, "timeout_s": 5}
    assert config.task(ValidationTaskConfig({"b": 3})) == {"fn_kwargs": {"a": 1, "b": 3},
                                                           "timeout_s": None}
    assert config.task(False) is None and config.threads == 1
    with pytest.raises(ConfigError, match="hpckit sets --wait itself"):
        ValidationConfig(len, sbatch={"--wait": "1"})
    with pytest.raises(ConfigError, match="must be a dict of sbatch options"):
        ValidationConfig(len, sbatch=["--partition=cpu"])  # type: ignore[arg-type]
    assert ValidationConfig(len, sbatch={"--partition": "cpu", "mem": 8}).sbatch == \
        {"partition": "cpu", "mem": "8"}
    with pytest.raises(ConfigError, match="not both"):
        ValidationConfig(len, ranks=1, sbatch={"partition": "cpu"})
    with pytest.raises(ConfigError, match=r"ranks=-1\) must be how many"):
        ValidationConfig(len, ranks=-1)


def test_ranks_set_aside_to_validate_are_counted_in_the_launch():
    from hpckit import ScalingConfig
    from hpckit.errors import LaunchError
    from hpckit.run.ranks import check_world

    check_world(4, ScalingConfig(num_workers=3), 1, None)
    with pytest.raises(LaunchError, match=r"num_workers=3\) and ValidationConfig\(ranks=1\) "
                                          r"but 3 rank\(s\) were launched; make them agree "
                                          r"\(mpirun -n 4"):
        check_world(3, ScalingConfig(num_workers=3), 1, None)


def test_an_elastic_run_takes_any_world_within_its_range_and_names_the_nearest_end():
    from hpckit import ScalingConfig
    from hpckit.errors import LaunchError
    from hpckit.run.ranks import check_world

    elastic = ScalingConfig(num_workers=(2, 4))
    for size in (2, 3, 4):
        check_world(size, elastic, 0, None)
    for size, nearest in ((1, 2), (5, 4)):
        with pytest.raises(LaunchError, match=rf"num_workers=\(2, 4\)\) but {size} rank\(s\) "
                                              rf"were launched; .*mpirun -n {nearest} "):
            check_world(size, elastic, 0, None)
    assert (elastic.min_workers, elastic.max_workers, elastic.elastic) == (2, 4, True)
    fixed = ScalingConfig(num_workers=(3, 3))
    assert (fixed.min_workers, fixed.max_workers, fixed.elastic) == (3, 3, False)
    assert ScalingConfig(num_workers=[1, 2]).num_workers == (1, 2)  # as a JSON config gives it


def test_waiting_for_a_purge_never_joins_a_thread_not_yet_started(tmp_path, monkeypatch):
    """A background commit starts the purge on the commit thread while the training thread
    waits for it (CI once failed: "cannot join thread before it is started"). The thread's
    start is slowed here, so that the wait comes in between."""
    import threading

    from hpckit.experiment.manifest import CheckpointRecord
    from hpckit.experiment.purge import Purge

    started = threading.Event()
    real_start = threading.Thread.start

    def slow_start(thread: threading.Thread) -> None:
        started.set()
        time.sleep(0.3)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    purge = Purge(resolve(str(tmp_path)))
    (tmp_path / "checkpoint_000000").mkdir()
    record = CheckpointRecord(0, "checkpoint_000000", 0, 0.0, {}, ())
    starter = threading.Thread(target=purge.start, args=([record],))
    real_start(starter)
    started.wait(5)
    purge.wait()  # raised RuntimeError when the thread was published before it started
    starter.join()
    purge.wait()
    assert not (tmp_path / "checkpoint_000000").exists()


def test_an_internal_error_says_where_to_report_it_and_survives_pickling():
    """A ProtocolError travels between ranks pickled; its message says once where to go."""
    import pickle

    from hpckit.errors import ProtocolError

    error = pickle.loads(pickle.dumps(ProtocolError("the plan of step 3 writes no checkpoint")))
    text = str(error)
    assert text.startswith("the plan of step 3 writes no checkpoint; this is a defect of hpckit")
    assert text.count("issue tracker") == 1 and "hpckit doctor" in text, text


def test_a_rank_set_aside_answers_even_when_it_cannot_validate(tmp_path):
    """Rank 0 waits for an outcome from each validation it sends: one that cannot even start
    on the validation rank (its folder is gone) is answered as failed, naming the rank."""
    from types import SimpleNamespace

    from hpckit import Checkpoint, ValidationConfig
    from hpckit.experiment.validation import FAILED, PENDING, Validation
    from hpckit.run.validation.pool import _answer

    pending = Validation(PENDING, {})
    link = SimpleNamespace(rank=3)  # never asked: the validation fails before any message
    for payload in (str(tmp_path / "gone"), OSError(28, "No space left on device")):
        ended = _answer(link, payload, ValidationConfig(len), Checkpoint.from_directory(tmp_path),
                        pending)
        assert ended is not None and ended.status == FAILED, ended
        assert ended.error.startswith("on validation rank 3: "), ended.error


def test_a_slow_import_of_torch_is_told_to_forward_an_early_stop_signal():
    """The advice for a slow shared filesystem gives the batch-shell signal with the trap that
    forwards it: --signal=B:... alone reaches the batch script, never the ranks."""
    from hpckit.doctor.framework import SLOW_IMPORT_S, torch_build

    build, timing = torch_build([{"version": "2.13.0", "cuda": None,
                                  "import_s": SLOW_IMPORT_S + 1}])
    assert build.status == "ok" and timing.status == "warn"
    assert "@300 rather than @120 in #SBATCH --signal" in timing.fix


def test_the_no_spare_advice_says_a_new_job_resumes_only_an_experiment_the_user_named():
    from hpckit.launch.steps import how_to_continue

    named = how_to_continue("42", "/runs/resnet", named=True)
    assert "submit it again: it resumes" in named and "scontrol requeue 42" in named
    default = how_to_continue("42", "/runs/train-job42", named=False)
    assert "submit it again: it resumes" not in default
    assert "hpckit resume /runs/train-job42 --sbatch" in default
    assert "scontrol requeue 42" in default


def test_a_uri_without_credentials_is_recorded_as_typed():
    """hpckit resume re-ran ``--uri sqlite:////abs/mlflow.db`` as ``sqlite://abs/...``."""
    assert redact("--uri sqlite:////tmp/x/mlflow.db") == "--uri sqlite:////tmp/x/mlflow.db"
    assert redact("s3://bucket//a?region=x") == "s3://bucket//a?region=x"
    assert redact("s3://key:secret@bucket/a") == "s3://***@bucket/a"
