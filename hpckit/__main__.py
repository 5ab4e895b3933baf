"""``python -m hpckit``: the ``hpckit`` command under this interpreter (job scripts name
their virtualenv's python, not whichever ``hpckit`` is first on PATH)."""

from hpckit.cli import main

main()
