#!/bin/bash
# slurm.conf: Prolog=/path/to/jobpulse/slurm/prolog.sh (with PrologFlags=Alloc)
exec "$(dirname "${BASH_SOURCE[0]}")/hook.sh" prolog
