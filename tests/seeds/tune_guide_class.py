"""Ray Tune's class API (tune.Trainable) with checkpoint_freq and checkpoint_at_end, ported by
changing `from ray import tune` to `from hpckit import tune`. ITERATIONS sets the stop."""

import json
import os

from hpckit import tune  # was: from ray import tune


class MyTrainableClass(tune.Trainable):
    def setup(self, config):
        self.x = 0
        self.lr = config["lr"]

    def step(self):
        self.x += 1
        return {"score": self.x * self.lr}

    def save_checkpoint(self, checkpoint_dir):
        path = os.path.join(checkpoint_dir, "checkpoint")
        with open(path, "w") as f:
            f.write(json.dumps({"x": self.x}))
        return path

    def load_checkpoint(self, checkpoint_path):
        with open(checkpoint_path) as f:
            self.x = json.loads(f.read())["x"]
        print(f"LOADED lr={self.lr} x={self.x} iteration={self.iteration}", flush=True)


if __name__ == "__main__":
    analysis = tune.run(
        MyTrainableClass,
        name="class-exp",
        config={"lr": tune.grid_search([1, 2])},
        stop={"training_iteration": int(os.environ.get("ITERATIONS", "5"))},
        checkpoint_freq=2,
        checkpoint_at_end=True,
        local_dir=os.environ["LOCAL_DIR"],
        resume="AUTO",
    )
    print("LAST " + json.dumps(sorted(t.last_result["score"] for t in analysis.trials)),
          flush=True)
