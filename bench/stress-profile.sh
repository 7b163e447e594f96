#!/usr/bin/env bash
# A reference stress profile (stress/profiles/) side by side, in one run: Mailcluster
# (release build, PostgreSQL + Redis) and Postfix + Dovecot from /work/shared/peers,
# each on its own listeners, one after the other, with the same users (user0001…,
# password "pass") and empty maildrops at the start (the profile seeds its own).
# Each side gets the runner's console report, JSON and HTML report. Run as root.
#
# Usage: bench/stress-profile.sh PROFILE [OUT_DIR]   (e.g. submission-pop3)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
PROFILE=${1:?usage: bench/stress-profile.sh PROFILE [OUT_DIR]}
OUT=${2:-bench/results/profile-$PROFILE}
mkdir -p "$OUT"
for p in 2526 2587 4465 1993 1995; do
  port_open "$p" || { echo "Postfix/Dovecot are not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }
done
users=$(target/release/mailcluster stress --profile "$PROFILE" --print 2>/dev/null | awk '/^  count:/{print $2; exit}')
users=${users:-100}
# The peers' maildrops start empty, as Mailcluster's do.
for n in $(seq 1 "$users"); do
  d=$PEERS/mail/example.test/$(printf user%04d "$n")/Maildir
  rm -rf "$d"
done
mc_start "$users" smtp,submission,submissions,imaps,pop3,pop3s
machine_line | tee "$OUT/machine.txt"
echo "mailcluster: $MC serve over PostgreSQL + Redis; MAILCLUSTER_* as set by bench/lib.sh mc_start" | tee -a "$OUT/machine.txt"
# The targets the profile names (each keeps the TLS mode the profile gives it).
targets=$(target/release/mailcluster stress --profile "$PROFILE" --print 2>/dev/null | sed -n '/^targets:/,/^users:/p')
has_target() { grep -q "^  $1:" <<<"$targets"; }
side() { # label smtp submission submissions imaps pop3s
  local label=$1 c0="" args=()
  has_target smtp && args+=(--smtp "127.0.0.1:$2")
  has_target submission && args+=(--submission "127.0.0.1:$3")
  has_target submissions && args+=(--submissions "127.0.0.1:$4")
  has_target imap && args+=(--imap "127.0.0.1:$5")
  has_target pop3 && args+=(--pop3 "127.0.0.1:$6")
  [ "$label" = mailcluster ] && c0=$(cpu_secs "$MC_PID")
  "$STRESS" --profile "$PROFILE" "${args[@]}" \
    -k --no-progress --json "$OUT/$label.json" --html "$OUT/$label.html" >"$OUT/$label.txt" 2>&1
  echo "$label: exit $?"
  [ -n "$c0" ] && echo "mailcluster server CPU: $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s" | tee -a "$OUT/$label.txt"
  tail -n 25 "$OUT/$label.txt"
}
side postfix-dovecot 2526 2587 4465 1993 1995
side mailcluster "$(mc_port smtp)" "$(mc_port submission)" "$(mc_port submissions)" "$(mc_port imaps)" "$(mc_port pop3s)"
