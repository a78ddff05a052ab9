"""`python -m jobpulse.agent.slurm prolog|epilog|serve|sync`: what slurm/hook.sh and the units run."""

import sys

from jobpulse.agent.slurm.hooks import main

sys.exit(main(sys.argv))
