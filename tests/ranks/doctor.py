"""``hpckit doctor`` as a script, for launchers that take a script path (the nodes harness)."""

import sys

from hpckit.cli import main

main(["doctor", *sys.argv[1:]])
