"""Storage: where bytes live and how they move.

Owns: locations (a pyarrow filesystem plus a path on it, with a redacted display form), the
S3 options, reading/writing/listing/deleting, the one hashed copy every transfer uses, and
the per-node shared download of a remote checkpoint.

May import: the ground layer (errors, settings, logs, processes), pyarrow and click. Knows
nothing of experiments, manifests, ranks or MPI.
"""
