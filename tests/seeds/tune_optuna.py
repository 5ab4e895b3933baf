"""Ray Tune's Optuna example (optuna_example.py) with its imports changed: OptunaSearch behind
a ConcurrencyLimiter on a function whose optimum is known (tanh, height -100, width 20).
``--samples`` and ``--steps`` keep it short; prints ``RESULT`` with the best config."""

import argparse
import json
import os
import time
from typing import Any

from hpckit import tune  # was: from ray import tune
from hpckit.tune.search import ConcurrencyLimiter  # was: from ray.tune.search import ...
from hpckit.tune.search.optuna import OptunaSearch  # was: from ray.tune.search.optuna import ...


def evaluate(step, width, height, activation):
    time.sleep(0.001)
    activation_boost = 10 if activation == "relu" else 0
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 + activation_boost


def objective(config: dict[str, Any]):
    for step in range(config["steps"]):
        score = evaluate(step, config["width"], config["height"], config["activation"])
        tune.report({"iterations": step, "mean_loss": score})
        if os.environ.get("HOLD_AT_TRIAL") == tune.get_context().get_trial_id():
            print("HOLDING", flush=True)
            time.sleep(600)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    args, _ = parser.parse_known_args()

    searcher = OptunaSearch(seed=7)
    algo = ConcurrencyLimiter(searcher, max_concurrent=4)
    tuner = tune.Tuner(
        objective,
        tune_config=tune.TuneConfig(
            metric="mean_loss",
            mode="min",
            search_alg=algo,
            num_samples=args.samples,
        ),
        run_config=tune.RunConfig(name="optuna_example"),
        param_space={
            "steps": args.steps,
            "width": tune.uniform(0, 20),
            "height": tune.uniform(-100, 100),
            "activation": tune.choice(["relu", "tanh"]),
        },
    )
    results = tuner.fit()
    print("Best hyperparameters found were: ", results.get_best_result().config)
    print("RESULT " + json.dumps({"trials": len(results), "best": results.get_best_result().config,
                                  "configs": [r.config for r in results]}))
