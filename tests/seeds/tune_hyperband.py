"""Ray Tune's HyperBand function example (hyperband_function_example.py) with its imports
changed, its state a small random walk so that a paused trial's resume can be told exact:
each report checkpoints the walk and its generator; a trial HyperBand pauses at a rung
resumes from that checkpoint. ``--reference`` runs the same configs to ``max_t`` without a
scheduler. Prints ``RESULT`` with every trial's config, status and final state."""

import argparse
import json
import os
import pickle
import tempfile

import numpy as np

from hpckit import tune  # was: from ray import tune
from hpckit.tune.schedulers import HyperBandScheduler  # was: from ray.tune.schedulers import ...

MAX_T = 4


def train_func(config):
    step = 0
    rng = np.random.default_rng(int(config["width"] * 1000))
    value = np.zeros(4)
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            with open(os.path.join(checkpoint_dir, "checkpoint.pkl"), "rb") as f:
                state = pickle.load(f)
            step, rng, value = state["timestep"] + 1, state["rng"], state["value"]

    for timestep in range(step, 100):
        value = value + rng.normal(size=4) * config["height"]
        v = float(np.tanh(float(timestep) / config.get("width", 1)) * config.get("height", 1))
        # Checkpoint the state of the training every step: HyperBand pauses trials at its rungs
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            with open(os.path.join(temp_checkpoint_dir, "checkpoint.pkl"), "wb") as f:
                pickle.dump({"timestep": timestep, "rng": rng, "value": value}, f)
            checkpoint = tune.Checkpoint.from_directory(temp_checkpoint_dir)
            tune.report({"episode_reward_mean": v, "walk": value.tolist()}, checkpoint=checkpoint)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--concurrent", type=int, default=None)
    args, _ = parser.parse_known_args()

    hyperband = HyperBandScheduler(max_t=MAX_T, reduction_factor=2)
    tuner = tune.Tuner(
        train_func,
        run_config=tune.RunConfig(
            name="hyperband_reference" if args.reference else "hyperband_test",
            stop={"training_iteration": MAX_T},
        ),
        tune_config=tune.TuneConfig(
            num_samples=args.samples,
            metric="episode_reward_mean",
            mode="max",
            scheduler=None if args.reference else hyperband,
            max_concurrent_trials=args.concurrent,
            seed=5,
        ),
        param_space={"height": tune.uniform(0, 100), "width": tune.randint(1, 10)},
    )
    results = tuner.fit()
    if os.environ.get("PMI_RANK", "0") != "0":
        raise SystemExit(0)  # under mpirun every rank has the results; one prints them
    print("Best hyperparameters found were: ", results.get_best_result().config)
    print("RESULT " + json.dumps([{"config": r.config, "walk": (r.metrics or {}).get("walk"),
                                   "iteration": len(r.metrics_history)} for r in results]))
