"""Ray Tune's ASHA example (async_hyperband_example.py) with its imports changed: ASHA stops
the poor trials of a function trainable early. ``--steps`` and ``--samples`` keep it short;
it prints ``ITERATIONS <total reports>`` and the best config."""

import argparse
import json
import time
from typing import Any

from hpckit import tune  # was: from ray import tune
from hpckit.tune.schedulers import AsyncHyperBandScheduler  # was: from ray.tune.schedulers import ...


def evaluation_fn(step, width, height) -> float:
    time.sleep(0.001)
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def easy_objective(config: dict[str, Any]):
    # Hyperparameters
    width, height = config["width"], config["height"]

    for step in range(config["steps"]):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height)
        # Feed the score back back to Tune.
        tune.report({"iterations": step, "mean_loss": intermediate_score})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--samples", type=int, default=20)
    args, _ = parser.parse_known_args()

    # AsyncHyperBand enables aggressive early stopping of bad trials.
    scheduler = AsyncHyperBandScheduler(grace_period=5, max_t=args.steps)

    tuner = tune.Tuner(
        easy_objective,
        run_config=tune.RunConfig(name="asynchyperband_test"),
        tune_config=tune.TuneConfig(
            metric="mean_loss", mode="min", scheduler=scheduler, num_samples=args.samples,
            seed=11,
        ),
        param_space={  # Hyperparameter space
            "steps": args.steps,
            "width": tune.uniform(10, 100),
            "height": tune.uniform(0, 100),
        },
    )
    results = tuner.fit()
    print("Best hyperparameters found were: ", results.get_best_result().config)
    print("ITERATIONS", sum(len(r.metrics_history) for r in results))
    print("RESULT " + json.dumps({"trials": len(results), "best": results.get_best_result().config}))
