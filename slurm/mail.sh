#!/bin/bash
# jobpulse: Slurm's MailProg (slurm.conf: MailProg=/opt/jobpulse/slurm/mail.sh). Adds the job's
# summary to its END, FAIL and TIME_LIMIT mails; anything it cannot enrich goes out unchanged through
# JOBPULSE_MAIL_FALLBACK (default /usr/bin/mail). Settings: jobpulse.conf beside this script, else
# /etc/jobpulse/jobpulse.conf.
# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/conf.sh"
# Slurm's own mail is never lost: when jobpulse cannot run at all, the mail program sends it as is.
body=$(mktemp) || exec "${JOBPULSE_MAIL_FALLBACK:-/usr/bin/mail}" "$@"
trap 'rm -f "$body"' EXIT
cat > "$body"
"${JOBPULSE_PYTHON:-python3}" -m jobpulse.agent.slurm.mail_prog "$@" < "$body" && exit 0
"${JOBPULSE_MAIL_FALLBACK:-/usr/bin/mail}" "$@" < "$body"
