#!/bin/bash
# jobpulse: the body of prolog.sh and epilog.sh. Runs as root on every node of a job, under a
# hard time bound, and always exits 0: monitoring must never fail or hold up a job.
# Settings come from jobpulse.conf beside this script, else /etc/jobpulse/jobpulse.conf;
# "%n" in any setting stands for the node name (as in slurm.conf).
what=$1
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/conf.sh"
export PATH="${JOBPULSE_PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
node=${SLURMD_NODENAME:-$(hostname -s)}
for var in $(compgen -e); do
    case ${!var} in *%n*) export "$var=${!var//%n/$node}" ;; esac
done
log_dir=${JOBPULSE_LOG_DIR:-/var/log/jobpulse}
mkdir -p "$log_dir" 2>/dev/null
log="$log_dir/$what.log"
timeout -k 1 "${JOBPULSE_HOOK_TIMEOUT:-10}" "${JOBPULSE_PYTHON:-python3}" -m jobpulse.agent.slurm "$what" >>"$log" 2>&1
status=$?
[ $status -eq 0 ] || echo "jobpulse $what: job ${SLURM_JOB_ID} on $node: gave up (status $status)" >>"$log" 2>/dev/null
exit 0
