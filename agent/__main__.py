"""`python -m jobpulse.agent`: the `jobpulse-agent` command line (the same as the script)."""

import sys

from jobpulse.agent.cli import main

sys.exit(main())
