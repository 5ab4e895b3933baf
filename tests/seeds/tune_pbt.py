"""Ray Tune's PBT function example (pbt_function.py) with its imports changed: a toy problem
whose best learning rate follows a triangle wave of the accuracy, a checkpoint every
iteration. ``--no-pbt`` runs the same population under FIFO. Its noise is seeded, and smaller
than Ray's, so that a short run tells PBT from its absence. Prints ``RESULT``."""

import argparse
import json
import os
import random
import tempfile

import numpy as np

from hpckit import tune  # was: from ray import tune
from hpckit.tune.schedulers import PopulationBasedTraining  # was: from ray.tune.schedulers import ...


def pbt_function(config):
    """Toy PBT problem for benchmarking adaptive learning rate: the accuracy increases
    fastest at the optimal lr, which is a function of the current accuracy."""
    lr = config["lr"]
    checkpoint_interval = config.get("checkpoint_interval", 1)
    accuracy = 0.0
    step = 1
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            with open(os.path.join(checkpoint_dir, "checkpoint.json")) as f:
                checkpoint_dict = json.load(f)
        accuracy = checkpoint_dict["acc"]
        last_step = checkpoint_dict["step"]
        step = last_step + 1

    midpoint = 100  # lr starts decreasing after acc > midpoint
    q_tolerance = 3  # penalize exceeding lr by more than this multiple
    noise_level = config.get("noise_level", 2)  # add gaussian noise to the acc increase
    while True:
        if accuracy < midpoint:
            optimal_lr = 0.01 * accuracy / midpoint
        else:
            optimal_lr = 0.01 - 0.01 * (accuracy - midpoint) / midpoint
        optimal_lr = min(0.01, max(0.001, optimal_lr))

        # compute accuracy increase
        q_err = max(lr, optimal_lr) / min(lr, optimal_lr)
        if q_err < q_tolerance:
            accuracy += (1.0 / q_err) * random.random() * 10
        elif lr > optimal_lr:
            accuracy -= (q_err - q_tolerance) * random.random()
        accuracy += noise_level * np.random.normal()
        accuracy = max(0, accuracy)

        metrics = {"mean_accuracy": accuracy, "cur_lr": lr, "optimal_lr": optimal_lr,
                   "q_err": q_err}
        if step % checkpoint_interval == 0:
            with tempfile.TemporaryDirectory() as tempdir:
                with open(os.path.join(tempdir, "checkpoint.json"), "w") as f:
                    json.dump({"acc": accuracy, "step": step}, f)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tempdir))
        else:
            tune.report(metrics)
        step += 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-pbt", action="store_true")
    parser.add_argument("--iterations", type=int, default=30)
    args, _ = parser.parse_known_args()
    random.seed(3)
    np.random.seed(3)

    perturbation_interval = 3
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=perturbation_interval,
        hyperparam_mutations={
            # distribution for resampling
            "lr": tune.uniform(0.0001, 0.02),
            # allow perturbations within this set of categorical values
            "some_other_factor": [1, 2],
        },
    )
    pbt._rng.seed(3)  # noqa: SLF001 (the test's own: the same exploits every run)

    tuner = tune.Tuner(
        pbt_function,
        run_config=tune.RunConfig(
            name="pbt_baseline" if args.no_pbt else "pbt_function_api_example",
            stop={"training_iteration": args.iterations},
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_score_attribute="mean_accuracy",
                num_to_keep=2,
            ),
        ),
        tune_config=tune.TuneConfig(
            scheduler=None if args.no_pbt else pbt,
            metric="mean_accuracy",
            mode="max",
            num_samples=4,
        ),
        param_space={
            "lr": 0.0001,
            # note: this parameter is perturbed but has no effect on
            # the model training in this example
            "some_other_factor": 1,
            # This parameter is not perturbed and is used to determine
            # checkpoint frequency. We set checkpoints and perturbations
            # to happen at the same frequency.
            "checkpoint_interval": perturbation_interval,
            "noise_level": 0.5,
        },
    )
    results = tuner.fit()
    best = results.get_best_result()
    print("Best hyperparameters found were: ", best.config)
    print("RESULT " + json.dumps({"best": best.metrics["mean_accuracy"],
                                  "configs": [r.config for r in results]}))
