import sys

from ecofl.cli import main

sys.exit(main())
