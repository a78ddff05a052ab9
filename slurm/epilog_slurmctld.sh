#!/bin/bash
# jobpulse: slurmctld's epilog (slurm.conf on the controller: EpilogSlurmctld=/opt/jobpulse/slurm/epilog_slurmctld.sh).
# Writes the job's summary into its AdminComment (Slurm's accounting: needs slurmdbd) once jobpulse
# has judged the job's end. It returns at once: the writer runs on in a session of its own, waits up
# to JOBPULSE_ADMIN_COMMENT_WAIT seconds (default 300) for the summary, and logs to
# $JOBPULSE_LOG_DIR/admin_comment.log, so neither slurmctld nor PrologEpilogTimeout waits on it.
# Settings: jobpulse.conf beside this script, else /etc/jobpulse/jobpulse.conf.
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/conf.sh"
export PATH="${JOBPULSE_PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
log_dir=${JOBPULSE_LOG_DIR:-/var/log/jobpulse}
mkdir -p "$log_dir" 2>/dev/null
setsid "${JOBPULSE_PYTHON:-python3}" -m jobpulse.agent.slurm.admin_comment </dev/null >>"$log_dir/admin_comment.log" 2>&1 &
exit 0
