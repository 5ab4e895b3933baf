"""MLflow sqlite stores for the tests that read back what hpckit logged to MLflow. Making a
store runs MLflow's schema migrations, seconds each time; an empty store is migrated once a
test run and each store is a copy of it, a file like any store MLflow made itself."""

from __future__ import annotations

import shutil

import pytest

from support.once import computed_once


def new_store(factory: pytest.TempPathFactory, name: str) -> str:
    """The tracking URI of a new, empty MLflow sqlite store of its own."""
    def migrated() -> str:
        from mlflow import MlflowClient

        path = factory.mktemp("mlflow-empty") / "mlflow.db"
        MlflowClient(f"sqlite:///{path}").search_experiments()
        return str(path)

    folder = factory.mktemp(name)
    shutil.copyfile(computed_once(factory, "mlflow-empty-store", migrated), folder / "mlflow.db")
    return f"sqlite:///{folder}/mlflow.db"
