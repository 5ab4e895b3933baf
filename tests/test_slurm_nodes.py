"""``python train.py`` in a Slurm allocation of several nodes (the three-node Slurm of
tests/support/slurm_cluster.py): its ranks spread over the allocation with srun, and a lost node is
replaced by a spare within the same job, from the last committed checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import HERE, HPCKIT, final_params, manifest, metrics_lines, run
from support.slurm_jobs import output_of, sbatch, wait

STEADY = HERE / "ranks" / "steady.py"
SWEEP = HERE / "ranks" / "sweep.py"
TEMPLATES = HERE.parent / "slurm"
pytestmark = pytest.mark.timeout(300)


def driver_script(tmp_path: Path, args: str) -> Path:
    """The batch script the docs teach for several nodes: the driver form, no srun."""
    script = tmp_path / "train.sbatch"
    script.write_text(f"#!/bin/bash\n{sys.executable} {STEADY} --storage {tmp_path} {args}\n")
    return script


def hosts_of(output: str) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for rank, host in re.findall(r"RANK (\d+) ON (\S+) END", output):
        found.setdefault(int(rank), set()).add(host)
    return found


def test_slurms_pmi_server_cuts_a_pmi1_request_longer_than_1024_bytes(slurm_nodes):
    """#56's cause, kept as a fact about the Slurm the tests run: slurmstepd reads a PMI-1
    request in a single read of 1,024 bytes, so it stores a longer put's value cut short
    and takes the rest of it for a request of its own."""
    def put(length: int) -> str:
        out = slurm_nodes.run("srun", "-N", "1", "--mpi=pmi2", "-t", "1", sys.executable,
                              str(HERE / "ranks" / "pmi1_put.py"), str(length), timeout=60,
                              check=False)
        return out.stdout + out.stderr

    short, long = put(1024), put(1040)
    assert "PUT OF 1024 BYTES: cmd=put_result rc=0" in short and "mpi/pmi2" not in short, short
    assert "PUT OF 1040 BYTES" in long, long
    assert "value not properly terminated" in long, long
    assert re.search(r"full request is: A{15}\s", long), "the last 16 bytes:\n" + long


def test_mpi_on_two_nodes_under_slurms_pmi_server_keeps_each_request_short(slurm_nodes):
    """#56: MPICH's UCX network module puts its address buffer, whose tail holds whatever the
    heap held, in PMI values of up to 1,022 characters: requests of up to about 1,080 bytes,
    which Slurm's PMI server cuts (above), and the job hangs or UCX aborts, depending on
    what the rank did before MPI_Init. The start-up hook chooses the OFI network module
    there (hpckit/run/startup/hook.py), whose requests stay far below 1,024 bytes."""
    out = slurm_nodes.run("timeout", "-s", "TERM", "60", "srun", "-N", "2", "--mpi=pmi2", "-t",
                          "2", sys.executable, str(HERE / "ranks" / "mpi_up.py"),
                          timeout=90, check=False, env_extra={"PMI_DEBUG": "1"})
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    assert sorted(re.findall(r"MPI UP rank (\d) netmod (\S+)", output)) == \
        [("0", "ofi"), ("1", "ofi")], output
    sent = re.findall(r"send to fd=\d+ pmi: (cmd=[^\n]*)", output)
    assert sent and max(len(request) for request in sent) < 512, output
    assert "mpi/pmi2" not in output, output


@pytest.mark.parametrize("launch", ["python", "hpckit run"])
def test_the_ranks_of_a_two_node_run_are_on_two_nodes(tmp_path, slurm_nodes, launch):
    """``python train.py`` and ``hpckit run -n 2 train.py`` in a two-node allocation."""
    args = f"{STEADY} --storage {tmp_path} --name two --workers 2 --epochs 2 --show-hosts"
    script = tmp_path / "two.sbatch"
    script.write_text(f"#!/bin/bash\n{sys.executable} {args}\n" if launch == "python" else
                      f"#!/bin/bash\n{HPCKIT} run -n 2 {args}\n")
    job = sbatch(slurm_nodes, tmp_path, script, "--nodes=2", "--ntasks-per-node=1",
                 HPCKIT_LOCAL_DIR=str(slurm_nodes.local))
    assert wait(slurm_nodes, tmp_path, job, 120) == {job: "COMPLETED"}, output_of(tmp_path)
    output = output_of(tmp_path)
    assert hosts_of(output) == {0: {"n1"}, 1: {"n2"}}, output
    assert "2 rank(s) on 2 node(s)" in output, output


def test_a_killed_rank_is_restarted_on_the_same_nodes(tmp_path, slurm_nodes, steady_reference):
    """A rank that dies (here SIGKILL, as the out-of-memory killer sends) does not condemn its
    node: the spare stays idle."""
    script = driver_script(tmp_path, "--name oom --workers 2 --epochs 8 --epoch-seconds 1 "
                                     "--max-failures 2 --show-hosts")
    job = sbatch(slurm_nodes, tmp_path, script, "--nodes=3", "--ntasks-per-node=1", "--no-kill",
                 HPCKIT_LOCAL_DIR=str(slurm_nodes.local))
    wait_committed(slurm_nodes, tmp_path, job, "oom", 3)
    ranks = [pid for pid in slurm_nodes.pids_on("n2")
             if b"hpckit.launch.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 1, ranks
    os.kill(ranks[0], signal.SIGKILL)
    assert wait(slurm_nodes, tmp_path, job, 180) == {job: "COMPLETED"}, output_of(tmp_path)
    output = output_of(tmp_path)
    assert final_params(output) == steady_reference, output
    assert hosts_of(output) == {0: {"n1"}, 1: {"n2"}}, output
    assert "lost (their slurmd does not answer)" not in output, output
    attempts = manifest(tmp_path / "oom")["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "finished"], attempts


def committed(tmp_path: Path, name: str) -> int:
    path = tmp_path / name
    return len(metrics_lines(path)) if (path / "metrics.jsonl").exists() else 0


def wait_committed(slurm, tmp_path: Path, job: str, name: str, reports: int) -> None:
    """Until the run ``name`` of the running ``job`` has committed ``reports`` reports."""
    deadline = time.monotonic() + 120
    while committed(tmp_path, name) < reports:
        assert time.monotonic() < deadline, output_of(tmp_path)
        assert wait_state(slurm, job) in ("PENDING", "RUNNING"), output_of(tmp_path)
        time.sleep(0.2)


def lose_node_after(slurm, tmp_path: Path, job: str, name: str, node: str, reports: int) -> float:
    """Kill ``node`` once the run has committed ``reports`` reports; when it was killed."""
    wait_committed(slurm, tmp_path, job, name, reports)
    slurm.kill_node(node)
    return time.time()


def ended(slurm, tmp_path: Path, job: str) -> str:
    """The job's state once its batch script has ended. A job that lost a node stays
    COMPLETING until Slurm hears from that node or marks it DOWN: the node is brought back
    (as node_back would) so that it completes."""
    deadline = time.monotonic() + 180
    while (state := wait_state(slurm, job)) in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, output_of(tmp_path)
        time.sleep(0.2)
    if state == "COMPLETING":
        bring_back(slurm, "n2")
        return wait(slurm, tmp_path, job, 60)[job]
    return state


def wait_state(slurm, job: str) -> str:
    out = slurm.run("scontrol", "show", "job", "-o", job, check=False).stdout
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else "UNKNOWN"


@pytest.fixture
def node_back(slurm_nodes):
    """The node a test loses (``node_back.append(name)``) is brought back after it, as a site's
    administrator would: marked DOWN (which ends what Slurm still counts as running there),
    its slurmd started again, and resumed."""
    lost: list[str] = []
    yield lost
    for node in lost:
        if node not in slurm_nodes.nodes:
            bring_back(slurm_nodes, node)


def bring_back(slurm, node: str) -> None:
    """``node`` marked DOWN (which ends what Slurm still counts as running there), its slurmd
    started again where the test has not started it already, and resumed. A DOWN node whose
    slurmd answers returns to service by itself (ReturnToService=2), maybe before a look
    sees it DOWN; then there is nothing to resume."""
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=lost in a test")
    if node not in slurm.nodes:
        slurm.start_node(node)
    wait_node(slurm, node, lambda state: state.startswith("DOWN") or state == "IDLE")
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    wait_node(slurm, node, lambda state: state == "IDLE")


def wait_node(slurm, node: str, wanted) -> None:
    """Until the node's state (``scontrol``'s: IDLE, DOWN+NOT_RESPONDING, ...) is ``wanted``."""
    deadline = time.monotonic() + 90
    while not wanted(state := node_state(slurm, node)):
        assert time.monotonic() < deadline, f"{node} stays {state}\n{slurm.logs()}"
        time.sleep(0.5)


def node_state(slurm, node: str) -> str:
    out = slurm.run("scontrol", "show", "node", "-o", node).stdout
    return re.search(r"State=(\S+)", out).group(1)


def spare_takes_over(slurm, tmp_path: Path, name: str, args: str, reports: int,
                     reference: list[float]) -> str:
    """A 2-rank run of ``args`` on n1 and n2 of a three-node allocation; n2 killed after
    ``reports`` reports. The job completes exact, rank 1 on the spare n3; its output."""
    script = driver_script(tmp_path, f"--name {name} --workers 2 --epochs 8 --epoch-seconds 1 "
                                     f"--max-failures 2 --show-hosts {args}")
    job = sbatch(slurm, tmp_path, script, "--nodes=3", "--ntasks-per-node=1", "--no-kill",
                 HPCKIT_LOCAL_DIR=str(slurm.local))
    lose_node_after(slurm, tmp_path, job, name, "n2", reports)
    assert ended(slurm, tmp_path, job) == "COMPLETED", output_of(tmp_path)
    output = output_of(tmp_path)
    assert final_params(output) == reference, output
    assert hosts_of(output) == {0: {"n1"}, 1: {"n2", "n3"}}, output
    attempts = manifest(tmp_path / name)["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "finished"], attempts
    restarts = slurm.run("scontrol", "show", "job", "-o", job).stdout
    assert "Restarts=0" in restarts, "the job was requeued: " + restarts
    return output


def test_the_lost_nodes_cached_checkpoint_comes_from_its_partner_and_not_from_storage(
        tmp_path, slurm_nodes, node_back, steady_reference):
    cache = slurm_nodes.local / "cache"  # each node's own disk, at the same path
    node_back.append("n2")
    output = spare_takes_over(slurm_nodes, tmp_path, "cached", f"--cache-dir {cache} "
                              "--persist-every 100 --redundancy partner --every-rank-saves", 4,
                              steady_reference)
    restart = re.search(r"restarting from checkpoint_\d+ in the node-local caches \(.*from "
                        r"partner copies: (\d+).*sent between nodes: (\d+)\); nothing read from "
                        r"storage_path", output)
    # The spare, n3, held nothing: rank 1's files came from n1, which kept n2's partner copy.
    assert restart and int(restart.group(1)) > 0 and int(restart.group(2)) > 0, output


def test_with_no_spare_node_the_job_is_requeued_and_completes_exact_once_the_node_is_back(
        tmp_path, slurm_nodes, node_back, steady_reference):
    script = driver_script(tmp_path, "--name nospare --workers 2 --epochs 8 --epoch-seconds 1 "
                                     "--max-failures 2")
    job = sbatch(slurm_nodes, tmp_path, script, "--nodelist=n1,n2", "--ntasks-per-node=1",
                 "--no-kill", "--requeue", HPCKIT_LOCAL_DIR=str(slurm_nodes.local))
    node_back.append("n2")
    lose_node_after(slurm_nodes, tmp_path, job, "nospare", "n2", 3)
    # As Slurm marks it after SlurmdTimeout. hpckit may requeue sooner (fc18: rank 0's MPI
    # failed at once on the lost peer), and Slurm then started the requeued job again within
    # a second on n1 and n2, which it still took for up; slurmd refused it ("Job credential
    # revoked") and the job ended FAILED.
    slurm_nodes.run("scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=lost in a test")
    deadline = time.monotonic() + 60
    while "no spare node is left" not in output_of(tmp_path):
        assert time.monotonic() < deadline, output_of(tmp_path)
        time.sleep(0.5)
    bring_back(slurm_nodes, "n2")
    assert wait(slurm_nodes, tmp_path, job, 180) == {job: "COMPLETED"}, output_of(tmp_path)
    output = output_of(tmp_path)
    assert final_params(output) == steady_reference, output
    assert f"scontrol requeue {job}" in output and "Nothing committed is lost" in output, output
    attempts = manifest(tmp_path / "nospare")["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "finished"], attempts
    assert "Restarts=1" in slurm_nodes.run("scontrol", "show", "job", "-o", job).stdout


def test_an_elastic_run_goes_on_with_one_rank_after_a_lost_node_and_grows_back_when_it_returns(
        tmp_path, slurm_nodes, node_back, steady_reference):
    """``num_workers=(1, 2)`` on two nodes, no spare: n2, rank 1's node, is lost; the run goes
    on with rank 0 alone in the same job (a failure, of max_failures=1), then, once n2's
    slurmd is back, grows back to two ranks (no failure: it stops to grow) and ends with
    every epoch committed once, its parameters those of an uninterrupted run."""
    script = driver_script(tmp_path, "--name elastic --min-workers 1 --workers 2 --epochs 8 "
                                     "--epoch-seconds 1.5 --max-failures 1 --resize-interval 1 "
                                     "--show-hosts")
    job = sbatch(slurm_nodes, tmp_path, script, "--nodelist=n1,n2", "--ntasks-per-node=1",
                 "--no-kill", "--no-requeue", HPCKIT_LOCAL_DIR=str(slurm_nodes.local))
    node_back.append("n2")
    lose_node_after(slurm_nodes, tmp_path, job, "elastic", "n2", 2)
    deadline = time.monotonic() + 60
    while len(attempts := manifest(tmp_path / "elastic")["attempts"]) < 2:
        assert time.monotonic() < deadline, output_of(tmp_path)
        time.sleep(0.2)
    wait_committed(slurm_nodes, tmp_path, job, "elastic", committed(tmp_path, "elastic") + 1)
    slurm_nodes.start_node("n2")  # back before Slurm marked it DOWN: still the job's
    assert ended(slurm_nodes, tmp_path, job) == "COMPLETED", output_of(tmp_path)
    output = output_of(tmp_path)
    assert final_params(output) == pytest.approx(steady_reference, rel=1e-9, abs=1e-12), output
    assert [line["metrics"]["epoch"] for line in metrics_lines(tmp_path / "elastic")] == list(range(8))
    attempts = manifest(tmp_path / "elastic")["attempts"]
    assert [(a["status"], a["world_size"]) for a in attempts] == \
        [("failed", 2), ("stopped", 1), ("finished", 2)], attempts
    assert "restart 1 of 1, on 1 rank(s) instead of 2" in output, output
    assert re.search(r"node\(s\) n2 of Slurm job \d+ are back; the run grows to 2 rank", output)
    assert "Restarts=0" in slurm_nodes.run("scontrol", "show", "job", "-o", job).stdout


def test_a_sweep_in_an_allocation_spreads_its_trials_and_a_lost_node_costs_only_its_trial(
        tmp_path, slurm_nodes, node_back):
    """``python sweep.py`` in a three-node allocation, four one-rank trials two at a time:
    each trial a job step, on n1 and n2 first; n2, the node of a running trial, is lost. Its
    trial starts again on another node from its checkpoint (one of its max_failures=1), the
    other goes on, the job completes without a requeue, and every trial has each step once.
    Of the two trials that start later, lr=0.3 raises once, in its first attempt, and starts
    again from its checkpoint as a lost node's trial does (its step's ranks raised it; they
    had recorded it ERROR with no restart); lr=0.4 reports metrics that are no JSON, which a
    restart would meet again: ERROR at once."""
    script = tmp_path / "sweep.sbatch"
    script.write_text(f"#!/bin/bash\n{sys.executable} {SWEEP} --storage {tmp_path} "
                      "--grid 0.1,0.2,0.3,0.4 --concurrent 2 --max-failures 1 "
                      "--fail-once-lr 0.3 --refuse-lr 0.4\n")
    job = sbatch(slurm_nodes, tmp_path, script, "--nodes=3", "--ntasks-per-node=1", "--no-kill",
                 HPCKIT_LOCAL_DIR=str(slurm_nodes.local), STEP_SECONDS="1.5")
    node_back.append("n2")
    sweep = tmp_path / "grid"
    deadline = time.monotonic() + 120
    while not (on_n2 := [t for t in trials_reported(sweep) if t[1][-1:] == ["n2"]]):
        assert time.monotonic() < deadline, output_of(tmp_path)
        time.sleep(0.2)
    slurm_nodes.kill_node("n2")
    assert ended(slurm_nodes, tmp_path, job) == "COMPLETED", output_of(tmp_path)
    output = output_of(tmp_path)
    grid = json.loads(output.split("GRID ", 1)[1].splitlines()[0])
    assert (grid["terminated"], grid["errors"]) == (3, 1), output
    for traceback in output.split("Traceback")[1:]:  # lr=0.3's own, shown; no other
        assert "ValueError: lr 0.3 diverged once" in "\n".join(traceback.splitlines()[:12]), output
    hosts = dict(trials_reported(sweep))
    assert len(hosts) == 4 and {"n1", "n2"} <= {h for trial in hosts.values() for h in trial}
    for dirname, trial_hosts in hosts.items():
        lost, once, refused = dirname == on_n2[0][0], "lr=0.3" in dirname, "lr=0.4" in dirname
        assert not lost or not (once or refused), (dirname, "started first", output)
        steps = [m["metrics"]["step"] for m in metrics_lines(sweep / dirname)]
        assert steps == ([0] if refused else [0, 1, 2]), (dirname, output)
        statuses = [a["status"] for a in manifest(sweep / dirname)["attempts"]]
        assert statuses == (["failed"] if refused else ["failed", "finished"] if lost or once
                            else ["finished"]), (dirname, output)
        assert (trial_hosts[-1] != "n2") if lost else ("n2" not in trial_hosts[1:]), output
    assert f"trial {on_n2[0][0]} failed on n2" in output, output
    assert output.count("(restart 1 of 1)") == 2, output
    assert re.search(r"trial \S*lr=0\.4\S* not restarted: a restart from the last committed "
                     r"checkpoint would meet the same MetricsError again", output), output
    assert "Restarts=0" in slurm_nodes.run("scontrol", "show", "job", "-o", job).stdout


def trials_reported(sweep: Path) -> list[tuple[str, list[str]]]:
    """Each trial that has committed a report: its directory and the hosts of its reports."""
    if not (sweep / "sweep.json").exists():
        return []
    found = []
    for trial in json.loads((sweep / "sweep.json").read_text())["trials"]:
        log = sweep / trial["dirname"] / "metrics.jsonl"
        if log.exists():
            found.append((trial["dirname"], [m["metrics"]["host"] for m in metrics_lines(
                sweep / trial["dirname"])]))
    return found


def requeued_and_resumed(slurm, tmp_path: Path, job: str, name: str, reports: int) -> None:
    """Until the requeued job's run has committed ``reports`` reports in all."""
    deadline = time.monotonic() + 120
    while committed(tmp_path, name) < reports or len(manifest(tmp_path / name)["attempts"]) < 2:
        assert time.monotonic() < deadline, output_of(tmp_path)
        time.sleep(0.2)


def test_the_multi_node_script_as_written_survives_a_time_limit_warning_then_a_lost_node(
        tmp_path, slurm_nodes, node_back, steady_reference):
    """slurm/multi-node.sbatch as it is, only its ranks per node and time limit sized to the
    test's three nodes of one CPU: Slurm's warning before the time limit (``--signal=B:USR2``,
    sent here as Slurm sends it, to the batch process: ``exec python train.py``) reaches the
    ranks on both nodes, which commit, requeue the job and exit; the requeued job resumes,
    then loses n2, and the spare n3 takes rank 1's place in the same job. It ends exact."""
    args = "--name multi --workers 2 --epochs 8 --epoch-seconds 1 --max-failures 2 --show-hosts"
    job = sbatch(slurm_nodes, tmp_path, TEMPLATES / "multi-node.sbatch", "--ntasks-per-node=1",
                 "--time=10", PYTHON=sys.executable, SCRIPT=str(STEADY), SCRIPT_ARGS=args,
                 HPCKIT_STORAGE=str(tmp_path), HPCKIT_LOCAL_DIR=str(slurm_nodes.local))
    wait_committed(slurm_nodes, tmp_path, job, "multi", 2)
    slurm_nodes.run("scancel", "--batch", "--signal=USR2", job)
    requeued_and_resumed(slurm_nodes, tmp_path, job, "multi", 4)
    node_back.append("n2")
    lose_node_after(slurm_nodes, tmp_path, job, "multi", "n2", 5)
    assert ended(slurm_nodes, tmp_path, job) == "COMPLETED", output_of(tmp_path)
    output = output_of(tmp_path)
    assert final_params(output) == steady_reference, output
    assert hosts_of(output) == {0: {"n1"}, 1: {"n2", "n3"}}, output
    assert re.search(r"node\(s\) n2 of Slurm job \d+ lost", output), output
    statuses = [a["status"] for a in manifest(tmp_path / "multi")["attempts"]]
    assert statuses == ["requeued", "failed", "finished"], statuses
    restarts = slurm_nodes.run("scontrol", "show", "job", "-o", job).stdout
    assert "Restarts=1" in restarts, "the lost node requeued the job: " + restarts
    # Slurm ends a requeued job's batch process with SIGTERM: the driver says nothing of it.
    assert "second SIGTERM" not in output, output


def test_hpckit_resume_sbatch_writes_that_form_and_its_job_replaces_a_lost_node(
        tmp_path, slurm_nodes, node_back, steady_reference):
    """A run of multi-node.sbatch stopped by the warning in a job that may not requeue:
    ``hpckit resume --sbatch`` writes the script's form with the last allocation's three
    nodes (a spare among them), and its job, ``hpckit resume`` as the batch process, starts
    the ranks on two nodes, watches their heartbeats, replaces n2 by the spare when n2 is
    lost, and finishes the run exact."""
    args = "--name again --workers 2 --epochs 8 --epoch-seconds 1 --show-hosts"
    env = {"HPCKIT_LOCAL_DIR": str(slurm_nodes.local)}
    job = sbatch(slurm_nodes, tmp_path, TEMPLATES / "multi-node.sbatch", "--ntasks-per-node=1",
                 "--no-requeue", "--time=10", PYTHON=sys.executable, SCRIPT=str(STEADY),
                 SCRIPT_ARGS=args, HPCKIT_STORAGE=str(tmp_path), **env)
    wait_committed(slurm_nodes, tmp_path, job, "again", 2)
    slurm_nodes.run("scancel", "--batch", "--signal=USR2", job)
    wait(slurm_nodes, tmp_path, job, 120)
    stopped = committed(tmp_path, "again")
    script = tmp_path / "resume.sbatch"
    out = run([HPCKIT, "resume", "--sbatch", str(script), "--max-failures", "2", "--time", "10",
               "--slurm", "cpus-per-task=1", str(tmp_path / "again")], timeout=30,
              env={**slurm_nodes.env, **env})
    text = script.read_text()
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n#SBATCH --no-kill\n" in text, text
    again = re.search(r"submitted job (\d+)", out.output).group(1)
    node_back.append("n2")
    lose_node_after(slurm_nodes, tmp_path, again, "again", "n2", stopped + 2)
    assert ended(slurm_nodes, tmp_path, again) == "COMPLETED", output_of(tmp_path)
    output = output_of(tmp_path)
    assert final_params(output) == steady_reference, output
    assert hosts_of(output) == {0: {"n1"}, 1: {"n2", "n3"}}, output
    assert re.search(r"node\(s\) n2 of Slurm job \d+ lost", output), output
    attempts = manifest(tmp_path / "again")["attempts"]
    assert [a["status"] for a in attempts] == ["stopped", "failed", "finished"], attempts
    assert attempts[1]["error"] == "node(s) n2 lost, with their ranks", attempts


def test_the_gpu_script_differs_from_the_multi_node_one_only_in_its_resources():
    """What the three-node test proves of multi-node.sbatch holds for multi-node-gpu.sbatch."""
    def body(name: str) -> list[str]:
        lines = (TEMPLATES / name).read_text().splitlines()
        return [line for line in lines if line.startswith("#SBATCH") or not line.startswith("#")]

    cpu, gpu = body("multi-node.sbatch"), body("multi-node-gpu.sbatch")
    resources = ("#SBATCH --ntasks-per-node", "#SBATCH --gpus-per-node", "#SBATCH --cpus-per-task")
    assert [line for line in cpu if not line.startswith(resources)] == \
        [line for line in gpu if not line.startswith(resources)]
    assert any(line.startswith("#SBATCH --gpus-per-node") for line in gpu)
