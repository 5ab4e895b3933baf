"""A sweep over learning rate x batch size (hpckit.tune, Ray Tune's API): every trial is
fashion_hdf5.py's CNN trained with DDP on 2 ranks, checkpointed each epoch, its 2 most
accurate checkpoints kept. Two trials run at a time, on 4 ranks that hpckit starts (or
that mpiexec or srun start); stopped midway (Ctrl-C, a killed job, a time limit) and run
again, the sweep resumes:

    python examples/sweep_fashion.py            # or: mpiexec -n 4 python examples/sweep_fashion.py
    hpckit ls ~/hpckit_results/sweep-fashion
    hpckit plot ~/hpckit_results/sweep-fashion --metric accuracy -o sweep.png
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fashion_hdf5 import arguments, train_loop, with_loader_workers, write_dataset  # noqa: E402

from hpckit import CheckpointConfig, RunConfig, ScalingConfig, tune, world_rank  # noqa: E402
from hpckit.torch import TorchTrainer  # noqa: E402


def main() -> None:
    parser = with_loader_workers(arguments(
        "A learning rate x batch size sweep on FashionMNIST-shaped HDF5", "sweep-fashion"))
    parser.add_argument("--train-size", type=int, default=6000, help="images to train on")
    args = parser.parse_args()
    if world_rank() == 0 and not os.path.exists(args.data):
        write_dataset(args.data, n_train=args.train_size)
    trainer = TorchTrainer(train_loop,
                           train_loop_config={"epochs": args.epochs, "data": args.data,
                                              "loader_workers": args.loader_workers},
                           scaling_config=ScalingConfig(num_workers=args.workers))
    tuner = tune.Tuner(
        trainer,
        param_space={"lr": tune.grid_search([1e-3, 3e-3]), "batch_size": tune.grid_search([32, 128])},
        tune_config=tune.TuneConfig(metric="accuracy", mode="max", max_concurrent_trials=2),
        run_config=RunConfig(name=args.name, storage_path=args.storage,
                             checkpoint_config=CheckpointConfig(
                                 num_to_keep=2, checkpoint_score_attribute="accuracy",
                                 checkpoint_score_order="max")))
    grid = tuner.fit()
    if world_rank() == 0:
        best = grid.get_best_result()
        print(f"best: lr={best.config['lr']} batch_size={best.config['batch_size']} "
              f"accuracy {best.metrics['accuracy']:.3f} ({grid.num_terminated} of {len(grid)} "
              f"trials finished; {best.path})")


if __name__ == "__main__":
    main()
