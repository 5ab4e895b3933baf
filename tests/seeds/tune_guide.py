"""Ray Tune's checkpoint guide, its function API and tune.run call as written there, ported by
changing `from ray import tune` to `from hpckit import tune`. The test sets where it stores
(LOCAL_DIR, UPLOAD) and how it syncs (SYNCER); the trainable's auc goes up and down, so that
keeping the best five is a real choice."""

import json
import math
import os
import shutil
import time

from hpckit import tune  # was: from ray import tune

STEPS = int(os.environ.get("STEPS", "8"))


def my_trainable(config, checkpoint_dir=None):
    start = 0
    if checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "checkpoint")) as f:
            start = json.loads(f.read())["step"] + 1
        print(f"RESUMED lr={config['lr']} at step {start}", flush=True)
    for step in range(start, STEPS):
        time.sleep(float(os.environ.get("STEP_SECONDS", "0.05")))
        auc = 0.5 + 0.4 * math.sin(1.3 * step + config["lr"])
        with tune.checkpoint_dir(step=step) as checkpoint_dir:
            path = os.path.join(checkpoint_dir, "checkpoint")
            with open(path, "w") as f:
                f.write(json.dumps({"step": step}))
        tune.report(auc=auc, step=step)


def copy_experiment(source, target):
    """A syncer function, as the guide allows: (source, target)."""
    shutil.copytree(source, target, dirs_exist_ok=True)


SYNCERS = {"none": None, "auto": "auto", "callable": copy_experiment,
           "command": "mkdir -p {target} && cp -r {source}/. {target}"}

if __name__ == "__main__":
    analysis = tune.run(
        my_trainable,
        name="my-tune-exp",
        config={"lr": tune.grid_search([0.1, 0.2, 0.3])},
        local_dir=os.environ["LOCAL_DIR"],
        sync_config=tune.SyncConfig(upload_dir=os.environ.get("UPLOAD") or None,
                                    syncer=SYNCERS[os.environ.get("SYNCER", "auto")]),
        checkpoint_score_attr="max-auc",
        keep_checkpoints_num=5,
        resume="AUTO",
        metric="auc",
        mode="max",
    )
    best = analysis.get_best_trial("auc", "max")
    print("ANALYSIS " + json.dumps({
        "best_config": analysis.best_config,
        "best_trial_config": best.config,
        "best_checkpoint": analysis.best_checkpoint.path,
        "kept": [path for path, _ in analysis.get_trial_checkpoints_paths(best, "auc")],
        "statuses": sorted(t.status for t in analysis.trials),
        "rows": analysis.dataframe().num_rows}), flush=True)
