"""`python -m jobpulse`: the `jobpulse` command line (the same as the `jobpulse` script)."""

import sys

from jobpulse.collector.cli import main

sys.exit(main())
