"""One script, launched by hpckit itself or by mpiexec; a mismatched world is a clear error."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import manifest, mpiexec, python, run


@pytest.mark.parametrize("workers", [2, 3])
def test_python_script_starts_its_own_ranks(tmp_path, workers):
    result = python("--workers", str(workers), "--storage", str(tmp_path), "--epochs", "2",
                    "--checkpoint", "shards").result
    m = manifest(tmp_path / "exp")
    assert m["world_size"] == workers and m["command"]["launcher"] == "hpckit"
    files = {f["path"] for f in m["checkpoints"][-1]["files"]}
    assert files == {f"model-rank={r}.pt" for r in range(workers)} | {"state.json"}
    assert result["checkpoint"] == str(tmp_path / "exp" / "checkpoint_000001")


def test_unguarded_script_runs_its_top_level_code_after_fit_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import hpckit
        from hpckit import RunConfig, ScalingConfig
        from hpckit.torch import TorchTrainer

        def loop():
            hpckit.report({{"rank": hpckit.get_context().get_world_rank()}})

        result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=3),
                              run_config=RunConfig(name="u", storage_path={str(tmp_path)!r})).fit()
        print("AFTER-FIT", result.metrics)
    """))
    out = run([sys.executable, str(script)], timeout=90)
    assert out.output.count("AFTER-FIT") == 1 and "AFTER-FIT {'rank': 0}" in out.output


@pytest.mark.parametrize("launched,asked", [(2, 3), (1, 2)])
def test_num_workers_that_disagrees_with_the_launched_world_is_an_error(tmp_path, launched, asked):
    out = mpiexec(launched, "--workers", str(asked), "--storage", str(tmp_path), expect=3)
    assert (f"ScalingConfig(num_workers={asked}) but {launched} rank(s) were launched"
            in out.output)
    assert not (tmp_path / "exp").exists()


def test_a_lambda_cannot_be_sent_to_spawned_ranks(tmp_path):
    script = tmp_path / "lam.py"
    script.write_text(textwrap.dedent(f"""
        import hpckit
        from hpckit import RunConfig, ScalingConfig
        from hpckit.torch import TorchTrainer
        if __name__ == "__main__":
            try:
                TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=2),
                             run_config=RunConfig(name="l", storage_path={str(tmp_path)!r})).fit()
            except hpckit.LaunchError as exc:
                print("LAUNCH-ERROR", exc)
    """))
    out = run([sys.executable, str(script)], timeout=60)
    assert "LAUNCH-ERROR the trainer cannot be sent to the ranks" in out.output
    assert "module level" in out.output


def open_mpi_launcher(tmp_path) -> str:
    """An mpiexec that says it is Open MPI's and records how hpckit called it, then runs the
    ranks with this machine's MPICH (so that they train): the flags hpckit adds for Open MPI
    are seen without installing a second MPI."""
    import os
    import stat

    from conftest import MPIEXEC

    fake = tmp_path / "ompi-mpiexec"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = --version ]; then echo 'mpiexec (Open MPI) 5.0.11'; exit 0; fi
        printf "%s\\n" "$*" > {tmp_path}/called
        [ "$1" = --oversubscribe ] && shift
        exec {MPIEXEC} "$@"
        """))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert os.access(fake, os.X_OK)
    return str(fake)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="Open MPI refuses root only; the tests run as root in CI")
def test_open_mpi_as_root_is_one_line_naming_root_and_the_fix(tmp_path):
    out = python("--workers", "2", "--storage", str(tmp_path), expect=None,
                 env={"HPCKIT_MPIEXEC": open_mpi_launcher(tmp_path)})
    assert out.returncode != 0 and not (tmp_path / "called").exists()
    assert "refuses to start ranks as root" in out.output
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in out.output
    assert "training failed" not in out.output and "run the same command again" not in out.output


def test_open_mpi_is_allowed_root_when_asked_and_oversubscribed_beyond_the_cores(tmp_path):
    import os

    cores = len(os.sched_getaffinity(0))
    if cores > 3:
        pytest.skip("more ranks than cores would be slow to start on this machine")
    allowed = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "HPCKIT_MPIEXEC": open_mpi_launcher(tmp_path)}
    python("--workers", str(cores + 1), "--storage", str(tmp_path), "--epochs", "1", env=allowed)
    assert (tmp_path / "called").read_text().startswith(f"--oversubscribe -n {cores + 1} ")
    if cores > 1:
        python("--workers", str(cores), "--storage", str(tmp_path / "fit"), "--epochs", "1",
               env=allowed)
        assert (tmp_path / "called").read_text().startswith(f"-n {cores} ")
