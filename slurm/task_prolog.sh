#!/bin/bash
# slurm.conf: TaskProlog=/path/to/jobpulse/slurm/task_prolog.sh
# Runs as the job's user before each task; the "export" lines it prints reach the task's
# environment, so the application client finds the node agent's event socket.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
conf="$here/jobpulse.conf"
[ -r "$conf" ] || conf=/etc/jobpulse/jobpulse.conf
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf" 2>/dev/null
runtime=${JOBPULSE_RUNTIME_DIR:-/run/jobpulse}
runtime=${runtime//%n/${SLURMD_NODENAME:-$(hostname -s)}}
echo "export JOBPULSE_EVENTS_SOCKET=$runtime/events.sock"
echo "export JOBPULSE_JOB_ID=${SLURM_JOB_ID}"
exit 0
