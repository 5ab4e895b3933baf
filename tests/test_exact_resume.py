"""Exact resume (#52): every rank's loader position and random streams are saved with every
checkpoint and restored at the first ``get_checkpoint()``, so that a run killed and restarted
mid-epoch ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile

import numpy as np
import pytest
import torch
from support.cluster_nodes import nodes  # noqa: F401  (the fixture)
from conftest import HERE, HPCKIT, manifest, metrics_lines, mpiexec, python, run
from support.mlflow_store import new_store
from support.slurm_jobs import minimal_script, output_of, sbatch, wait, wait_for_reports
from support.once import computed_once
from torch.utils.data import DataLoader, Dataset

from hpckit.integrations.torch.loader import put_back_random, random_snapshot
from hpckit.integrations.torch.prepare import prepare_data_loader

EXACT = HERE / "ranks" / "exact.py"


class Noisy(Dataset):
    """Each sample draws from the process's streams, as an augmentation does."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, torch.rand(()).item() + random.random() + float(np.random.rand())


def _draws() -> tuple[float, float, float]:
    return torch.rand(()).item(), random.random(), float(np.random.rand())


@pytest.mark.quick
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_loader_put_back_mid_pass_continues_it_and_the_random_streams_as_uninterrupted(
        workers, shuffle):
    def loader():
        return prepare_data_loader(DataLoader(Noisy(), batch_size=3, shuffle=shuffle,
                                              num_workers=workers))

    torch.manual_seed(1)
    first = loader()
    batches = iter(first)
    before = [next(batches), next(batches)]
    saved, kept = first.state_dict(), random_snapshot()
    rest, after = [b[0].tolist() for b in batches], _draws()

    torch.manual_seed(99)
    again = loader()
    again.load_state_dict(saved)
    put_back_random(kept)
    continued = [b[0].tolist() for b in again]
    assert len(before) == 2 and continued == rest
    assert _draws() == after  # with no workers the samples drew from these streams too
    assert again.epoch == first.epoch


@pytest.mark.quick
def test_a_pass_that_ended_before_the_checkpoint_is_not_continued():
    first = prepare_data_loader(DataLoader(Noisy(), batch_size=4, shuffle=True))
    list(first)
    saved = first.state_dict()
    again = prepare_data_loader(DataLoader(Noisy(), batch_size=4, shuffle=True))
    again.load_state_dict(saved)
    assert sum(len(b[0]) for b in again) == 10


def _final(output: str) -> list[str]:
    found = re.search(r"FINAL (\{[^{}]*\})", output)
    assert found is not None, f"training did not finish:\n{output}"
    return json.loads(found.group(1))["params"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow sqlite store for the module (making one costs seconds of migrations)."""
    return new_store(tmp_path_factory, "mlflow")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run's parameters and loss history, computed once a test run (each
    worker's module would run it again). The history is what the run reported (its
    metrics.jsonl) at the steps ``MLflowLoggerCallback`` logs it at (the report's index + 1,
    as Ray's ``training_iteration``), the values the killed runs' MLflow stores must hold:
    the run itself logs to no MLflow store, whose import would cost each of its processes
    seconds."""
    def compute() -> dict:
        storage = tmp_path_factory.mktemp("uninterrupted")
        params = _final(python("--storage", str(storage), "--name", "ref", script=EXACT).output)
        reports = metrics_lines(storage / "ref")
        return {"params": params,
                "history": sorted((r["step"] + 1, r["metrics"]["loss"]) for r in reports)}

    found = computed_once(tmp_path_factory, "exact-resume-reference", compute)
    return {"params": found["params"], "history": [tuple(m) for m in found["history"]]}


@pytest.fixture(scope="module")
def uninterrupted(reference) -> list[str]:
    return reference["params"]


def _logged(uri: str, experiment: str) -> tuple[str, list[tuple[int, float]]]:
    """The one MLflow run of ``experiment``: its status and its loss at each step."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    history = client.get_metric_history(run.info.run_id, "loss")
    return run.info.status, sorted((m.step, m.value) for m in history)


def test_two_ranks_killed_mid_epoch_at_different_steps_end_bit_identical(
        tmp_path, uninterrupted, store, reference):
    """The issue's test: the parameters bit-identical to an uninterrupted run's, and MLflow
    holding one run with every step logged once, its values the uninterrupted run's. ASYNC
    (the README's mode; SYNC is the exact-off test's and the requeue test's)."""
    mode = "async"
    markers = tmp_path / "markers"
    markers.mkdir()
    name = f"killed-{mode}"
    run = python("--storage", str(tmp_path), "--name", name, "--mode", mode, "--markers",
                 str(markers), "--kill", "1:12", "--kill", "0:17", "--mlflow", store,
                 script=EXACT, timeout=240)
    assert sorted(p.name for p in markers.iterdir()) == ["0-17", "1-12"], run.output
    attempts = manifest(tmp_path / name)["attempts"]
    assert len(attempts) == 3, attempts
    # each restart from a committed checkpoint, every one of which is mid-epoch (every 5
    # steps, 8 batches an epoch); which one depends on when ASYNC committed it
    resumed_from = [a.get("resumed_from") for a in attempts]
    assert resumed_from[0] is None and all(
        r is not None and r.startswith("checkpoint_") for r in resumed_from[1:]), attempts
    assert _final(run.output) == uninterrupted
    status, history = _logged(store, name)
    assert status == "FINISHED"
    assert [step for step, _ in history] == list(range(1, 25))
    assert history == reference["history"]
    # #66: the two ranks' states are one file of their node's, in every checkpoint
    assert _state_files(tmp_path / name) == {"node-00000"}, run.output


def test_a_restart_from_a_partner_copy_in_the_node_caches_ends_bit_identical(
        nodes, tmp_path, uninterrupted):
    """Checkpoints kept in node-local caches carry the ranks' states too, partner copies
    included: rank 1 is killed mid-epoch on nodeb, whose disk is then lost; the rerun restarts
    from the partner copy on nodea and ends as the uninterrupted run."""
    markers = tmp_path / "markers"
    markers.mkdir()
    args = ("--storage", str(tmp_path), "--name", "cached", "--cache", str(nodes.local),
            "--markers", str(markers), "--kill", "1:12", "--no-restart")
    # The "nodes" share this machine's network; a loader worker's socket path must fit in
    # AF_UNIX's 108 bytes, which the nodes' TMPDIR under pytest's folders may not.
    with tempfile.TemporaryDirectory(prefix="exact-") as short:
        here = {"HPCKIT_MASTER_ADDR": "127.0.0.1", "TMPDIR": short}
        killed = nodes.mpiexec(["nodea", "nodeb"], 1, EXACT, *args, env=here, expect=None,
                               timeout=180)
        assert killed.returncode != 0 and (markers / "1-12").exists(), killed.output
        assert {c["level"] for c in manifest(tmp_path / "cached")["checkpoints"]} == {"cache"}
        nodes.lose_disk("nodeb")
        rerun = nodes.mpiexec(["nodea", "nodeb"], 1, EXACT, *args, env=here, timeout=180)
    assert re.search(r"restarting from checkpoint_\d+ in the node-local caches \(.*from partner "
                     r"copies: [1-9]", rerun.output), rerun.output
    assert "no resume state" not in rerun.output, rerun.output
    assert _final(rerun.output) == uninterrupted


def test_without_exact_resume_the_same_kills_end_elsewhere(tmp_path, uninterrupted):
    """The check above can fail: without the saved state, the restarted run differs."""
    markers = tmp_path / "markers"
    markers.mkdir()
    run = python("--storage", str(tmp_path), "--name", "e", "--exact", "off", "--mode", "sync",
                 "--markers", str(markers), "--kill", "1:12", script=EXACT, timeout=240)
    assert "from checkpoint_000001" in run.output, run.output  # step 10's, mid-epoch
    assert _final(run.output) != uninterrupted


class _Counter:
    """A keeper whose state is one number."""

    def __init__(self, value: int) -> None:
        self.value = value

    def state_dict(self) -> int:
        return self.value

    def load_state_dict(self, state: int) -> None:
        self.value = state


@pytest.mark.quick
def test_another_world_size_leaves_the_states_behind_in_one_warning_line(tmp_path, caplog):
    """hpckit resume -n 3 from a checkpoint of 2 ranks: nothing put back, and one line says
    why and what resumes exactly; at the same size each keeper gets its state, a loader
    prepared later too."""
    from hpckit.run.session.resumable import RankState
    from hpckit.run.writing.writer import node_states, write_state
    from hpckit.storage.location import local

    checkpoint = local(str(tmp_path))
    for rank in range(2):  # two nodes of one rank each
        saver = RankState(rank, 2, None, streams={"random": _Counter(10 + rank)})
        saver.keep_loader(_Counter(20 + rank))
        write_state(checkpoint, rank, node_states([rank], [saver.capture()]))
    resized = RankState(0, 3, checkpoint, streams={"random": _Counter(0)})
    resized.restore()
    assert resized.keepers["random"].value == 0
    [line] = [r.getMessage() for r in caplog.records if "written by 2 ranks" in r.getMessage()]
    assert "this run has 3" in line and "hpckit resume -n 2" in line
    same = RankState(1, 2, checkpoint, streams={"random": _Counter(0)})
    same.restore()
    later = _Counter(0)
    same.keep_loader(later)
    assert same.keepers["random"].value == 11 and later.value == 21


def test_a_slurm_job_requeued_mid_epoch_ends_bit_identical_as_one_mlflow_run(
        tmp_path, slurm, uninterrupted, store, reference):
    """The issue's test through a requeue on the one-node Slurm: srun starts the two ranks,
    ``scontrol requeue`` ends them mid-run, the requeued job (same id, same experiment)
    resumes from a checkpoint taken mid-epoch."""
    command = (f"{sys.executable} {EXACT} --storage {tmp_path} --name requeued --mlflow {store} "
               "--step-seconds 0.25 --mode sync")
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, command), "--time=10")
    wait_for_reports(slurm, tmp_path, tmp_path / "requeued", 12, 180)
    slurm.run("scontrol", "requeue", job)
    assert wait(slurm, tmp_path, job, 300) == {job: "COMPLETED"}, output_of(tmp_path)
    output = output_of(tmp_path)
    resumed_from = manifest(tmp_path / "requeued")["attempts"][-1].get("resumed_from")
    assert resumed_from is not None and resumed_from.startswith("checkpoint_"), output
    assert _final(output) == uninterrupted
    status, history = _logged(store, "requeued")
    assert status == "FINISHED" and history == reference["history"]


def test_a_run_killed_mid_epoch_and_continued_by_hpckit_resume_ends_bit_identical(
        tmp_path, uninterrupted, store, reference):
    """The same through ``hpckit resume``, at the kill harness's phase of exact resume: rank 1,
    in a node of its own here (a node's first rank writes its states), dies right after its
    background thread wrote its node's state file of checkpoint_000002, before rank 0 hears
    of it, which ends the run (no restarts). That checkpoint is never committed; the command
    the manifest recorded continues from checkpoint_000001 on one node, where rank 1 finds
    its state in the other node's file, ends as the uninterrupted run, and the experiment
    verifies."""
    experiment = tmp_path / "resumed"
    killed = python("--storage", str(tmp_path), "--name", "resumed", "--no-restart", "--mlflow",
                    store, script=EXACT, timeout=240, expect=None,
                    env={"HPCKIT_FAULT": "resume_state:1:3", "HPCKIT_RANKS_PER_NODE": "1"})
    assert killed.returncode != 0, killed.output
    assert [c["directory"] for c in manifest(experiment)["checkpoints"]] == [
        "checkpoint_000000", "checkpoint_000001"], killed.output
    out = run([HPCKIT, "resume", str(experiment)], timeout=240)
    assert manifest(experiment)["attempts"][-1].get("resumed_from") == "checkpoint_000001", \
        out.output
    assert _final(out.output) == uninterrupted
    assert run([HPCKIT, "verify", str(experiment)], timeout=60).returncode == 0
    status, history = _logged(store, "resumed")
    assert status == "FINISHED" and history == reference["history"]


LOADERS = HERE / "ranks" / "loaders.py"


def test_the_loaders_users_write_resume_bit_identical(tmp_path, tmp_path_factory):
    """#66, the loaders of tests/ranks/loaders.py on two ranks: an IterableDataset that
    shuffles in ``__iter__`` (resumed mid-pass at step 9), a steps_per_epoch loop that breaks
    out of it (resumed at an epoch's end, step 16, where the uninterrupted run starts a new
    pass), a validation loader with the user's own generator cut with ``break``. Killed
    twice, each rank once; the parameters and every validation loss as uninterrupted."""
    def compute() -> dict:  # the two ranks under mpiexec: no restarts, so no launcher process
        storage = tmp_path_factory.mktemp("loaders-uninterrupted")
        return _finals(mpiexec(2, "--storage", str(storage), "--name", "ref", script=LOADERS,
                               timeout=180).output)

    reference = computed_once(tmp_path_factory, "loaders-reference", compute)
    markers = tmp_path / "markers"
    markers.mkdir()
    run = python("--storage", str(tmp_path), "--name", "killed", "--kill", "1:11", "--kill",
                 "0:17", "--markers", str(markers), script=LOADERS, timeout=240,
                 env={"HPCKIT_RANKS_PER_NODE": "1"})  # two nodes: a states file each
    assert sorted(p.name for p in markers.iterdir()) == ["0-17", "1-11"], run.output
    assert [a.get("resumed_from") for a in manifest(tmp_path / "killed")["attempts"]] == [
        None, "checkpoint_000003", "checkpoint_000006"], run.output
    assert _finals(run.output) == reference
    assert "naively fast-forwarding" not in run.output, run.output
    assert _state_files(tmp_path / "killed") == {"node-00000", "node-00001"}, run.output


def _state_files(experiment) -> set[str]:
    """The names of the resume state files in every committed checkpoint (one set each)."""
    found = set()
    for record in manifest(experiment)["checkpoints"]:
        folder = experiment / record["directory"] / ".hpckit-resume"
        found.add(frozenset(p.name for p in folder.iterdir()))
    assert len(found) == 1, found
    return set(found.pop())


def _finals(output: str) -> dict:
    found = re.search(r"FINAL (\{.*\})", output)
    assert found is not None, f"training did not finish:\n{output}"
    return json.loads(found.group(1))


@pytest.mark.quick
def test_a_nodes_states_are_one_file_found_by_each_rank_whatever_its_node_now(tmp_path):
    """#66: one resume state file a node (its leader's), not a rank: a rank finds its own in
    its node's file, in another node's where the ranks lie elsewhere now, and in a
    checkpoint written before states went by node, in its own ``rank-NNNNN``."""
    from hpckit.run.writing.writer import node_states, read_state, write_state
    from hpckit.storage.location import local

    checkpoint = local(str(tmp_path / "by-node"))
    for members in ((0, 1, 2), (3, 4)):
        write_state(checkpoint, members[0], node_states(members, [b"s%d" % r for r in members]))
    names = sorted(p.name for p in (tmp_path / "by-node" / ".hpckit-resume").iterdir())
    assert names == ["node-00000", "node-00003"]
    assert read_state(checkpoint, 4, 3) == b"s4"
    assert read_state(checkpoint, 3, 2) == b"s3"  # rank 3 now shares rank 2's node
    assert read_state(checkpoint, 5, 5) is None
    legacy = tmp_path / "legacy" / ".hpckit-resume"
    legacy.mkdir(parents=True)
    (legacy / "rank-00001").write_bytes(b"old")
    assert read_state(local(str(tmp_path / "legacy")), 1, 0) == b"old"
