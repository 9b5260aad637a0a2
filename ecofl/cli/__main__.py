"""``python -m ecofl.cli``: the ``ecofl`` command where the script is not on PATH."""

import sys

from ecofl.cli import main

sys.exit(main())
