"""The third launch mode: ``srun python train.py`` inside a real Slurm allocation."""

from __future__ import annotations

import sys

from conftest import JOB, manifest, run


def test_srun_launch_trains_with_every_task_as_a_rank(tmp_path, slurm):
    """TorchTrainer's Gloo rendezvous and DDP under srun's PMI-2."""
    run(["srun", "-n", "3", "--mpi=pmi2", "-t", "2", sys.executable, str(JOB), "--storage",
         str(tmp_path), "--workers", "3", "--checkpoint", "shards", "--epochs", "2", "--torch"],
        timeout=120, env=slurm.env)
    m = manifest(tmp_path / "exp")
    assert m["world_size"] == 3 and m["attempts"][0]["launcher"] == "srun"
    assert m["attempts"][0]["slurm"]["job_id"].isdigit()
    assert {f["rank"] for f in m["checkpoints"][-1]["files"]} == {0, 1, 2}


def test_srun_without_pmi_is_refused_instead_of_training_separate_worlds(tmp_path, slurm):
    out = run(["srun", "-n", "2", "--mpi=none", "-t", "2", sys.executable, str(JOB), "--storage",
               str(tmp_path), "--workers", "2"], timeout=120, env=slurm.env, expect=None)
    assert out.returncode != 0, out.output
    assert "started 2 tasks but MPI sees a world of 1" in out.output and "--mpi=pmi2" in out.output
