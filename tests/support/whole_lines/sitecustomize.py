"""Every process the tests start writes each line of output whole, in one write.

The tests run their processes with PYTHONUNBUFFERED=1, so that what a rank printed before it
was killed is still seen. Unbuffered, ``print`` writes its text and its newline apart, and a
line another thread or rank writes in between lands inside the first one: a test that reads
``COUNTED {...}`` then reads a log line after the JSON. Line buffering keeps that promise and
writes each line in one piece (conftest puts this directory on PYTHONPATH)."""

import sys

for stream in (sys.stdout, sys.stderr):
    if stream is not None and getattr(stream, "write_through", False):
        stream.reconfigure(line_buffering=True, write_through=False)
