"""``python -m tests.faults``: see :mod:`tests.faults.cli`."""

import sys

from .cli import main

sys.exit(main())
