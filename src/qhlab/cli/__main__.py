"""``python -m qhlab.cli``: the same entry point as the ``qhlab`` console script."""

import sys

from qhlab.cli import main

sys.exit(main())
