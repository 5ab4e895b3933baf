"""What setup.cfg cannot say: where the start-up hook goes (everything else is in setup.cfg).

``hpckit-early.pth`` must land in the site-packages of the Python that installs hpckit, for a
wheel and an editable install alike. setup.cfg's data files take a fixed path, and the one it
had, ``lib/python3.11/site-packages``, is a folder Python 3.12 never reads.
"""

import os
import sysconfig

from setuptools import setup
from setuptools.command.editable_wheel import editable_wheel

HOOK = "hpckit/run/startup/hpckit-early.pth"


def hook_directory(purelib: str, data: str) -> str:
    """The data-files folder that puts a file into ``purelib``: installers place data files
    under the scheme's ``data`` path (the environment's prefix), so it is the one relative to
    the other, as the interpreter that builds for the install reports them."""
    return os.path.relpath(purelib, data)


class EditableWheelWithData(editable_wheel):
    """An editable install that installs the data files too. setuptools means to (it runs
    ``install_data`` "as non editable"), but asks the distribution for ``has_data``, which is
    called ``has_data_files``, so it never does (pypa/setuptools#3399). If setuptools renames
    the method this overrides, tests/test_install.py fails."""

    def _run_install(self, category: str) -> None:
        if category == "data" and self.distribution.has_data_files():
            self.run_command("install_data")
        else:
            super()._run_install(category)


if __name__ == "__main__":
    paths = sysconfig.get_paths()
    setup(data_files=[(hook_directory(paths["purelib"], paths["data"]), [HOOK])],
          cmdclass={"editable_wheel": EditableWheelWithData})
