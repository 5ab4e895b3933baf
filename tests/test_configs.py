"""What the config objects and entry points refuse, and how: metrics values, validation configs, prepare_model, the optional extras, internal errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hpckit.errors import ConfigError, MetricsError
from hpckit.experiment.values import to_json_metrics

pytestmark = pytest.mark.quick


def test_metrics_conversion():
    out = to_json_metrics({"t": torch.tensor(1.5), "n": np.float32(2.0), "i": np.int64(3),
                           "nan": math.nan, "list": [torch.tensor([4])], "d": {"b": True}})
    assert out == {"t": 1.5, "n": 2.0, "i": 3, "nan": None, "list": [4], "d": {"b": True}}


def test_metrics_refuse_multi_element_tensors():
    with pytest.raises(MetricsError, match="metric 'w'"):
        to_json_metrics({"w": torch.ones(3)})


def test_validation_configs_say_what_is_wrong():
    from hpckit import ValidationConfig, ValidationTaskConfig

    with pytest.raises(ConfigError, match=r"timeout_s=0\) must be a number of seconds > 0"):
        ValidationTaskConfig(timeout_s=0)
    with pytest.raises(ConfigError, match="must hold JSON values"):
        ValidationTaskConfig(fn_kwargs={"model": object()})
    with pytest.raises(ConfigError, match="must be a function"):
        ValidationConfig("validate")  # type: ignore[arg-type]
    config = ValidationConfig(len, ValidationTaskConfig({"a": 1, "b": 2}, timeout_s=5))
    assert config.task(True) == {"fn_kwargs": {"a": 1, "b": 2}, "timeout_s": 5}
    assert config.task(ValidationTaskConfig({"b": 3})) == {"fn_kwargs": {"a": 1, "b": 3},
                                                           "timeout_s": None}
    assert config.task(False) is None and config.threads == 1
    with pytest.raises(ConfigError, match="hpckit sets --wait itself"):
        ValidationConfig(len, sbatch={"--wait": "1"})
    with pytest.raises(ConfigError, match="must be a dict of sbatch options"):
        ValidationConfig(len, sbatch=["--partition=cpu"])  # type: ignore[arg-type]
    assert ValidationConfig(len, sbatch={"--partition": "cpu", "mem": 8}).sbatch == \
        {"partition": "cpu", "mem": "8"}
    with pytest.raises(ConfigError, match="not both"):
        ValidationConfig(len, ranks=1, sbatch={"partition": "cpu"})
    with pytest.raises(ConfigError, match=r"ranks=-1\) must be how many"):
        ValidationConfig(len, ranks=-1)


def test_prepare_model_names_what_it_takes():
    from hpckit.integrations.torch.prepare import fully_sharded
    from hpckit.torch import prepare_model

    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match=r"parallel_strategy='zero'\): give 'ddp', 'fsdp' or None"):
        prepare_model(model, parallel_strategy="zero")
    with pytest.raises(ConfigError, match=r"\['find_unused_parameters'\] are DDP's keywords"):
        prepare_model(model, parallel_strategy="fsdp", find_unused_parameters=True)
    with pytest.raises(ConfigError, match=r"FSDP1's \['cpu_offload', 'sharding_strategy'\]; "
                                          r"give cpu_offload: offload_policy="):
        fully_sharded(model, torch.device("cpu"), {"sharding_strategy": 1, "cpu_offload": 2})
    assert prepare_model(model, move_to_device=False, parallel_strategy=None) is model


@pytest.mark.parametrize("face,name,package", [("lightning", "RayDDPStrategy", "lightning"),
                                               ("transformers", "prepare_trainer", "transformers")])
def test_a_missing_extra_is_named_with_its_install_command(face, name, package):
    """As on a machine without the extra: the package cannot be imported."""
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            f"import hpckit.{face}\n"
            f"try:\n    hpckit.{face}.{name}\nexcept ModuleNotFoundError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    clone = Path(__file__).resolve().parent.parent  # hpckit runs from this clone
    assert out.stdout.strip() == (f"hpckit.{face}.{name} needs {package}, which is not "
                                  f"installed: pip install -e '{clone}[{face}]'"), out.stderr


def test_an_extra_outside_a_clone_is_named_from_the_clone_it_came_from(monkeypatch):
    from hpckit.integrations import optional

    monkeypatch.setattr(optional, "hpckit_clone", lambda: None)
    assert optional.install_command("lightning") == (
        "pip install -e '.[lightning]' in the clone of hpckit that you installed it from")


def test_an_internal_error_says_where_to_report_it_and_survives_pickling():
    """A ProtocolError travels between ranks pickled; its message says once where to go."""
    import pickle

    from hpckit.errors import ProtocolError

    error = pickle.loads(pickle.dumps(ProtocolError("the plan of step 3 writes no checkpoint")))
    text = str(error)
    assert text.startswith("the plan of step 3 writes no checkpoint; this is a defect of hpckit")
    assert text.count("issue tracker") == 1 and "hpckit doctor" in text, text
