#!/bin/bash
# slurm.conf: Epilog=/path/to/jobpulse/slurm/epilog.sh
exec "$(dirname "${BASH_SOURCE[0]}")/hook.sh" epilog
