#!/usr/bin/env bash
# Outbound mail, side by side in one run: messages submitted (587, STARTTLS + AUTH
# PLAIN) for recipients at another domain, relayed to a loopback sink (Postfix's
# smtp-sink, the same for both sides), by
#   - Mailcluster (release `mailcluster serve`, PostgreSQL + Redis): DKIM-signed
#     (ed25519) at submission, queued, sent by its relay workers after an MX lookup
#     at a loopback DNS server (testkit's test_dns);
#   - Postfix from /work/shared/peers: the same load through its submission port,
#     relayed by a transport map entry for the sink's domain (no DKIM: Debian's
#     Postfix has no signer built in).
# The figure is the rate at which messages reach the sink while the load runs, and
# how long the last ones take after it stops. Run as root.
#
# Usage: RATE=2000 DUR=30 USERS=50 bench/outbound.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
RATE=${RATE:-2000}
DUR=${DUR:-30}
USERS=${USERS:-50}
CONC=${CONC:-100}
OUT=${1:-bench/results/outbound}
SINK_PORT=32626
mkdir -p "$OUT"
for p in 2587; do
  port_open "$p" || { echo "Postfix is not running: start /work/shared/peers/setup-postfix-dovecot.sh"; exit 1; }
done
nice cargo build -q --release -p mailcluster-testkit --example test_dns || exit 1

WORK=$(mktemp -d)
cleanup_outbound() {
  [ -n "${SINK_PID:-}" ] && kill "$SINK_PID" 2>/dev/null
  [ -n "${DNS_PID:-}" ] && kill "$DNS_PID" 2>/dev/null
  postconf -X transport_maps 2>/dev/null && postfix reload >/dev/null 2>&1
  rm -rf "$WORK"
  mc_cleanup
}
trap cleanup_outbound EXIT

# The sink's domain: MX → 127.0.0.1.
printf '@ 60 IN MX 10 mx.sink.test.\nmx 60 IN A 127.0.0.1\n' >"$WORK/sink.zone"
target/release/examples/test_dns "sink.test.=$WORK/sink.zone" >"$WORK/dns.addr" &
DNS_PID=$!
for _ in $(seq 1 50); do [ -s "$WORK/dns.addr" ] && break; sleep 0.1; done
DNS_ADDR=$(cat "$WORK/dns.addr")

# Mailcluster: relay to the sink's port, resolver at the test DNS, a DKIM key.
"$MC" dkim generate example.test --selector bench --out "$WORK/dkim.key" >/dev/null || exit 1
cat >"$WORK/outbound.toml" <<TOML
[dns]
nameservers = ["$DNS_ADDR"]
[relay]
remote_port = $SINK_PORT
allowed_private_networks = ["127.0.0.0/8"]
[[dkim.keys]]
domain = "example.test"
selector = "bench"
key_file = "$WORK/dkim.key"
algorithm = "ed25519"
TOML
export MAILCLUSTER_CONFIG=$WORK/outbound.toml
mc_start "$USERS" smtp,submission
# mc_start installs its own EXIT trap; this one runs it too.
trap cleanup_outbound EXIT
machine_line | tee "$OUT/machine.txt"
{
  echo "mailcluster: $MC serve over PostgreSQL + Redis, MAILCLUSTER_* as bench/lib.sh mc_start sets them, plus:"
  sed 's/^/    /' "$WORK/outbound.toml"
  echo "load: $STRESS -s deliver --submission (STARTTLS) --smtp-target submission --auth plain --rate $RATE -d ${DUR}s -c $CONC --recipient-domain sink.test, 4 KiB messages"
} | tee -a "$OUT/machine.txt"

sink_count() { tr '\r' '\n' <"$1" | awk -F'mesg=' 'NF>1{n=$2} END{print n+0}'; }

side() { # label submission-port
  local label=$1 port=$2 sink="$WORK/sink-$1.out" c0="" t0 t_load n acked n_end t_end
  smtp-sink -c -u nobody "127.0.0.1:$SINK_PORT" 1024 >"$sink" 2>&1 &
  SINK_PID=$!
  sleep 0.5
  [ "$label" = mailcluster ] && c0=$(cpu_secs "$MC_PID")
  t0=$(date +%s.%N)
  "$STRESS" --submission "127.0.0.1:$port" --smtp-target submission -s deliver --auth plain --users-count "$USERS" --password pass \
    --rate "$RATE" -d "${DUR}s" -c "$CONC" --message-size 4k --recipient-domain sink.test \
    -k --no-progress --json "$OUT/$label.json" >"$OUT/$label.txt" 2>&1
  t_load=$(date +%s.%N)
  n=$(sink_count "$sink")
  acked=$(python3 -c "import json;d=json.load(open('$OUT/$label.json'));print(sum(s['ops']['deliver']['ok'] for s in d['scenarios']))") \
    || { echo "$label: the load run failed:"; tail -n 20 "$OUT/$label.txt"; exit 1; }
  # Wait (at most 10 min) for the sink to have every acknowledged message.
  for _ in $(seq 1 6000); do
    n_end=$(sink_count "$sink")
    [ "$n_end" -ge "$acked" ] && break
    sleep 0.1
  done
  t_end=$(date +%s.%N)
  kill "$SINK_PID" 2>/dev/null; wait "$SINK_PID" 2>/dev/null; SINK_PID=
  # The sink's counter line, once (its running output is one line per message).
  tr '\r' '\n' <"$sink" | tail -n 1 >"$OUT/sink-$label.txt"
  python3 - "$label" "$t0" "$t_load" "$t_end" "$n" "$n_end" "$acked" <<'PY' | tee -a "$OUT/summary.txt"
import sys
label, t0, tl, te, n, ne, acked = sys.argv[1], *map(float, sys.argv[2:5]), *map(int, sys.argv[5:8])
print(f"{label:<12} acknowledged {acked:>7}  at the sink during the load {n:>7} ({n/(tl-t0):8.1f}/s)  "
      f"all {ne:>7} after {te-t0:6.1f} s ({ne/(te-t0):8.1f}/s overall, last one {te-tl:5.1f} s after the load)")
PY
  [ -n "$c0" ] && echo "mailcluster server CPU: $(echo "$(cpu_secs "$MC_PID") - $c0" | bc) s" | tee -a "$OUT/summary.txt"
  tail -n 12 "$OUT/$label.txt"
}

: >"$OUT/summary.txt"
# Postfix relays mail for the sink's domain to the sink (undone on exit).
postconf -e "transport_maps = inline:{sink.test=smtp:[127.0.0.1]:$SINK_PORT}" && postfix reload >/dev/null 2>&1
sleep 1
side postfix 2587
side mailcluster "$(mc_port submission)"
bench_table "$OUT/postfix.json" "$OUT/mailcluster.json" | tee -a "$OUT/summary.txt"
