"""What the tests share and are not tests themselves: the real components they start (a
three-node Slurm, S3, nodes on one machine), the scenarios several test modules run, and the
suite's own machinery (turns, leftovers). Imported as ``from support.X import ...``; pytest
puts ``tests/`` on the path, beside ``conftest.py``."""
