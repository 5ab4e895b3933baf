"""The seed-port check for the integrations: Ray Train's getting-started programs for
Lightning and Transformers, ported by changing their imports and the lines that fetch models
and data (tests/seeds/), run as `python script.py` (hpckit starts the ranks), under
`mpiexec -n 2` and under `srun` in the user's own sbatch script, each run resuming the one
before and loading `result.checkpoint` as the guide does."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import HERE, MPIEXEC, manifest, metrics_lines, run
from support.slurm_jobs import minimal_script, output_of, sbatch, wait

SEEDS = HERE / "seeds"


@pytest.mark.parametrize("seed,package", [("lightning_guide", "lightning"),
                                          ("transformers_guide", "transformers")])
def test_ray_guide_program_runs_and_resumes_under_python_mpiexec_and_srun(seed, package,
                                                                          tmp_path, slurm):
    pytest.importorskip(package)
    script = [sys.executable, str(SEEDS / f"{seed}.py")]
    env = {"STORAGE": str(tmp_path), "HPCKIT_TENSORBOARD": "0"}
    loaded = []
    for epochs, launcher in ((1, []), (2, [MPIEXEC, "-n", "2"])):
        out = run([*launcher, *script], timeout=180, env={**env, "EPOCHS": str(epochs)},
                  cwd=tmp_path).output
        loaded += re.findall(r"LOADED \S+/(checkpoint_\d+) ", out)
    job = sbatch(slurm, tmp_path, minimal_script(tmp_path, 2, " ".join(script)), "--time=5",
                 **env, EPOCHS="3")
    assert wait(slurm, tmp_path, job, 180) == {job: "COMPLETED"}, output_of(tmp_path)
    loaded += re.findall(r"LOADED \S+/(checkpoint_\d+) ", output_of(tmp_path))
    assert loaded == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"], \
        output_of(tmp_path)
    experiment = tmp_path / seed
    attempts = manifest(experiment)["attempts"]
    assert [(a["status"], a["launcher"]) for a in attempts] == \
        [("finished", "hpckit"), ("finished", "mpiexec"), ("finished", "srun")]
    epochs = [line["metrics"]["epoch"] for line in metrics_lines(experiment)]
    assert epochs == ([0, 1, 2] if package == "lightning" else [1.0, 2.0, 3.0]), \
        "each run resumed where the one before ended"
