#!/bin/bash
# jobpulse: Slurm's MailProg (slurm.conf: MailProg=/opt/jobpulse/slurm/mail.sh). Adds the job's
# summary to its END, FAIL and TIME_LIMIT mails; anything it cannot enrich goes out unchanged through
# JOBPULSE_MAIL_FALLBACK (default /usr/bin/mail). Settings: jobpulse.conf beside this script, else
# /etc/jobpulse/jobpulse.conf.
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/conf.sh"
exec "${JOBPULSE_PYTHON:-python3}" -m jobpulse.agent.slurm_mail "$@" || exec "${JOBPULSE_MAIL_FALLBACK:-/usr/bin/mail}" "$@"
