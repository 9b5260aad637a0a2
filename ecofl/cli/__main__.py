"""``python -m ecofl.cli``: the ``ecofl`` command where the script is not on PATH."""

from ecofl.cli import run

run()
