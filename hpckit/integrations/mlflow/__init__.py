"""MLflow on hpckit, as Ray offers it in ``ray.air.integrations.mlflow``: the logger callback
(``callback``) and ``setup_mlflow`` (``setup``). Public names in :mod:`hpckit.mlflow`; the
``mlflow`` package is an optional extra (``pip install -e '.[mlflow]'`` in hpckit's clone)
that only these modules import."""
