# jobpulse: sourced by hook.sh and mail.sh. Exports the settings of jobpulse.conf beside the
# scripts, else /etc/jobpulse/jobpulse.conf (KEY=VALUE lines).
conf="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/jobpulse.conf"
[ -r "$conf" ] || conf=/etc/jobpulse/jobpulse.conf
set -a
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"
set +a
