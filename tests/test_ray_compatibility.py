"""docs/ray-compatibility.md lists every public name of Ray Train 2.60 and marks a name
supported exactly when hpckit exports it, so the page cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hpckit
import hpckit.lightning
import hpckit.mlflow
import hpckit.torch
import hpckit.transformers
import hpckit.tune
import hpckit.tune.schedulers
import hpckit.tune.search
import hpckit.wandb

pytestmark = pytest.mark.quick

PAGE = Path(__file__).parent.parent / "docs" / "ray-compatibility.md"

# ray.train.__all__ and ray.train.torch.__all__ of the Ray 2.60.0 wheel (Train V2 enabled).
RAY_TRAIN = {
    "get_checkpoint", "get_context", "get_dataset_shard", "report", "BackendConfig", "Checkpoint",
    "CheckpointConfig", "DataConfig", "FailureConfig", "Result", "RunConfig", "ScalingConfig",
    "SyncConfig", "TrainContext", "TrainingFailedError", "TRAIN_DATASET_KEY",
    "CheckpointUploadMode", "CheckpointConsistencyMode", "ControllerError", "NCCLHangError",
    "LoggingConfig", "PreemptionError", "PreemptionInfo", "ReportedCheckpoint",
    "ReportedCheckpointStatus", "UserCallback", "WorkerGroupError", "ValidationConfig",
    "ValidationFn", "ValidationTaskConfig", "get_all_reported_checkpoints", "get_preemption_info",
}
RAY_TRAIN_TORCH = {
    "TorchTrainer", "TorchCheckpoint", "TorchConfig", "accelerate", "get_device", "get_devices",
    "prepare_model", "prepare_optimizer", "prepare_data_loader", "backward",
    "enable_reproducibility",
}

# ray.train.lightning: the names Ray Train's Lightning guide uses, and its other strategies
# (the legacy LightningTrainer and its companions left Ray in 2.x and are not listed).
RAY_TRAIN_LIGHTNING = {
    "RayDDPStrategy", "RayDeepSpeedStrategy", "RayFSDPStrategy", "RayLightningEnvironment",
    "RayTrainReportCallback", "prepare_trainer",
}

RAY_TRAIN_TRANSFORMERS = {"RayTrainReportCallback", "prepare_trainer"}

# ray.air.integrations.mlflow and .wandb: what Ray's tracking guides import.
RAY_MLFLOW = {"MLflowLoggerCallback", "setup_mlflow"}
RAY_WANDB = {"WandbLoggerCallback", "setup_wandb"}

# ray.tune.__all__, ray.tune.schedulers.__all__ and ray.tune.search.__all__ of Ray 2.60.
RAY_TUNE = {
    "Callback", "Checkpoint", "CheckpointConfig", "CLIReporter", "Experiment",
    "ExperimentAnalysis", "FailureConfig", "JupyterNotebookReporter", "PlacementGroupFactory",
    "ProgressReporter", "Result", "ResultGrid", "ResumeConfig", "RunConfig", "Stopper",
    "SyncConfig", "Trainable", "TuneConfig", "TuneContext", "TuneError", "Tuner", "choice",
    "create_scheduler", "create_searcher", "get_checkpoint", "get_context", "grid_search",
    "lograndint", "loguniform", "qlograndint", "qloguniform", "qrandint", "qrandn", "quniform",
    "randint", "randn", "register_env", "register_trainable", "report", "run",
    "run_experiments", "sample_from", "uniform", "with_parameters", "with_resources",
}
RAY_TUNE_SCHEDULERS = {
    "ASHAScheduler", "AsyncHyperBandScheduler", "FIFOScheduler", "HyperBandForBOHB",
    "HyperBandScheduler", "MedianStoppingRule", "PB2", "PopulationBasedTraining",
    "PopulationBasedTrainingReplay", "ResourceChangingScheduler", "TrialScheduler",
    "create_scheduler",
}
RAY_TUNE_SEARCH = {
    "BasicVariantGenerator", "ConcurrencyLimiter", "Repeater", "SearchAlgorithm",
    "SearchGenerator", "Searcher", "create_searcher",
}


def _table(heading: str) -> dict[str, str]:
    section = PAGE.read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, re.M)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"a name is listed twice: {sorted(names)}"
    return {name: status.strip() for name, status in rows}


def test_every_ray_name_is_in_the_table_once_and_supported_means_exported():
    for heading, names, module in (("`ray.train` → `hpckit`", RAY_TRAIN, hpckit),
                                   ("`ray.train.torch` → `hpckit.torch`", RAY_TRAIN_TORCH,
                                    hpckit.torch),
                                   ("`ray.train.lightning` → `hpckit.lightning`",
                                    RAY_TRAIN_LIGHTNING, hpckit.lightning),
                                   ("`ray.train.huggingface.transformers` → "
                                    "`hpckit.transformers`", RAY_TRAIN_TRANSFORMERS,
                                    hpckit.transformers),
                                   ("`ray.air.integrations.mlflow` → `hpckit.mlflow`",
                                    RAY_MLFLOW, hpckit.mlflow),
                                   ("`ray.air.integrations.wandb` → `hpckit.wandb`",
                                    RAY_WANDB, hpckit.wandb),
                                   ("`ray.tune` → `hpckit.tune`", RAY_TUNE, hpckit.tune),
                                   ("`ray.tune.schedulers` → `hpckit.tune.schedulers`",
                                    RAY_TUNE_SCHEDULERS, hpckit.tune.schedulers),
                                   ("`ray.tune.search` → `hpckit.tune.search`",
                                    RAY_TUNE_SEARCH, hpckit.tune.search)):
        table = _table(heading)
        assert set(table) == names, set(table) ^ names
        assert set(table.values()) <= {"yes", "yes, differs", "no: not applicable", "not yet"}
        supported = {name for name, status in table.items() if status.startswith("yes")}
        assert supported == names & set(module.__all__), supported ^ (names & set(module.__all__))
        assert all(hasattr(module, name) for name in supported)
