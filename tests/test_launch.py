"""One script, launched by hpckit itself or by mpiexec; a mismatched world is a clear error."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import MPIEXEC, STEADY, manifest, mpiexec, python, run
from support.processes import ended_at_exit

from hpckit.run.writing.writer import state_name


@pytest.mark.parametrize("workers", [2, 3])
def test_python_script_starts_its_own_ranks(tmp_path, workers):
    """TorchTrainer on ranks hpckit started: DDP, and prepare_data_loader's disjoint shares."""
    result = python("--workers", str(workers), "--storage", str(tmp_path), "--epochs", "2",
                    "--checkpoint", "shards", "--torch").result
    m = manifest(tmp_path / "exp")
    assert m["world_size"] == workers and m["command"]["launcher"] == "hpckit"
    files = {f["path"] for f in m["checkpoints"][-1]["files"]}
    assert files == ({f"model-rank={r}.pt" for r in range(workers)} | {"state.json"}
                     | {state_name(0)})  # TorchTrainer: exact resume, one file for the node
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


@pytest.mark.parametrize("address, fault", [("no-such-host.invalid", "does not resolve"),
                                            ("192.0.2.1", "does not answer")])
def test_a_rendezvous_address_that_fails_is_one_error_within_seconds(tmp_path, address, fault):
    # torch's store would retry either for its whole timeout (30 minutes); 192.0.2.1 is a
    # documentation address that no host answers at.
    started = time.monotonic()
    out = mpiexec(2, "--storage", str(tmp_path), "--epochs", "1", "--torch", script=STEADY,
                  env={"HPCKIT_MASTER_ADDR": address}, expect=None, timeout=60)
    assert out.returncode != 0 and time.monotonic() - started < 45, out.output
    for rank in (0, 1):
        assert re.search(rf"rank {rank} on \S+: .*{address}.* {fault}", out.output), out.output
    assert "HPCKIT_MASTER_ADDR" in out.output and "Traceback" not in out.output, out.output


STUCK_IN_START_UP = """
import sys, time
import hpckit
from hpckit import DataParallelTrainer, RunConfig, ScalingConfig
from hpckit.run.job import Backend

def setup(self, group, scaling, settings):  # as ranks whose rendezvous never completes
    print("STUCK", flush=True)
    time.sleep(300)

Backend.setup = setup
DataParallelTrainer(lambda: hpckit.report({"step": 0}), scaling_config=ScalingConfig(num_workers=2),
                    run_config=RunConfig(name="stuck", storage_path=sys.argv[1])).fit()
"""


def test_a_sigterm_during_start_up_ends_the_ranks_within_seconds(tmp_path):
    # timeout(1) and scancel send SIGTERM: ranks still starting take it as the end, not as a
    # stop request held for a first report that they may never make.
    script, log = tmp_path / "train.py", tmp_path / "out.log"
    script.write_text(STUCK_IN_START_UP)
    with log.open("w") as out:
        process = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, str(script), str(tmp_path)],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    with ended_at_exit(process):
        deadline = time.monotonic() + 60
        while log.read_text().count("STUCK") < 2:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after SIGTERM:\n{log.read_text()}")
    assert process.returncode != 0, log.read_text()
    assert "SIGTERM during start-up" in log.read_text(), log.read_text()
    attempt = manifest(tmp_path / "stuck")["attempts"][-1]
    assert attempt["status"] == "interrupted", attempt
    assert "SIGTERM during start-up" in attempt["error"], attempt


def test_a_launcher_that_ended_the_ranks_with_a_sigterm_of_its_own_has_failed(caplog):
    """srun ends a job step whose node failed with SIGTERM to its tasks, and exits 143: where
    no SIGTERM reached the driver, that is a failure (restarted, or the lost node left out),
    not a termination passed on from here, which is never restarted."""
    from hpckit import exits, settings
    from hpckit.launch.process import Launch, run_process

    killed = Launch(("sh", "-c", "exit 143"))  # as srun exits when its tasks got SIGTERM
    assert run_process(killed, {}, settings.current()) == exits.FAILED
    assert "sh ended the ranks with SIGTERM, which did not come from here" in caplog.text
    assert exits.restarts_after(exits.FAILED) and not exits.restarts_after(exits.TERMINATED)



# Rank 1 comes 4 s after rank 0, as a rank that imports torch on a busy node does. Under
# mpiexec the script starts MPI itself at its top, so the ranks meet late at fit()'s start;
# under python, hpckit starts MPI in each rank before it imports the script, whose import is
# what comes late (where MPICH's own start-up would busy-poll).
LATE_PEER = """
import json, os, resource, sys, time

def cpu():
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime

if "--mpi-first" in sys.argv:
    from mpi4py import MPI
SINCE = (time.monotonic(), cpu())
if os.environ.get("PMI_RANK") == "1":
    time.sleep(4)

import hpckit
from hpckit import DataParallelTrainer, RunConfig, ScalingConfig

def loop(config):
    if hpckit.get_context().get_world_rank() == 0:
        print("WAITED " + json.dumps({"s": time.monotonic() - SINCE[0], "cpu": cpu() - SINCE[1]}),
              flush=True)

if __name__ == "__main__":
    DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(
        name="late", storage_path=sys.argv[1])).fit()
"""


@pytest.mark.parametrize("launcher", ["mpiexec", "python"])
def test_a_rank_that_comes_first_sleeps_until_its_peer_comes(launcher, tmp_path):
    """The ranks of a run come to its start seconds apart where they import torch on a busy
    node. The first waits in a barrier that sleeps, not in MPI's busy-polling Dup or MPICH's
    start-up, so that it leaves the CPU to the rank it waits for: rank 0 waits 4 s for rank 1
    and uses a small part of that in CPU (busy-polling, it took all of a core it got)."""
    script = tmp_path / "late.py"
    script.write_text(LATE_PEER)
    out = (mpiexec(2, str(tmp_path), "--mpi-first", script=script, timeout=60)
           if launcher == "mpiexec" else python(str(tmp_path), script=script, timeout=60))
    waited = json.loads(out.line("WAITED") or "null")
    assert waited is not None and waited["s"] >= 3.5, out.output
    assert waited["cpu"] < 0.25 * waited["s"], waited
