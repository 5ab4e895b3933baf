"""Checkpoint levels (``CheckpointConfig(cache_dir)``, docs/multilevel.md): one node's cache,
which level a checkpoint goes to, its partner copy and its drain to storage_path
(``levels``), and a restart from the caches before the experiment opens
(``restore``).

May import: ``run.writing``, ``run.mpi``, experiment, storage and the ground layer.
"""
