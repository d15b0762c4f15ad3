#!/usr/bin/env bash
# A local 3-process homing cluster on loopback: one etcd as the shared global
# store, and homingd for iad, fra and sin (each with its own redb DC store),
# configured by deploy/homingd-<dc>.toml with paths overridden by flags.
#
#   deploy/local-cluster.sh            # builds, starts, prints how to use it; Ctrl-C stops all
#   HOMING_CLUSTER_DIR=/tmp/c deploy/local-cluster.sh   # keep state between runs
#
# Needs: a Rust toolchain, protoc (protobuf-compiler, for the etcd feature) and
# etcd (etcd-server) on PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${HOMING_CLUSTER_DIR:-$(mktemp -d /tmp/homing-cluster-XXXXXX)}
mkdir -p "$work"
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 1; }
command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }

echo "building homingd (with etcd) and homing..."
(cd "$root" && cargo build -q -p homing-daemon --features etcd --bin homingd && cargo build -q -p homing-cli --bin homing)
bin=${CARGO_TARGET_DIR:-$root/target}/debug

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

[ -f "$work/certs/ca.pem" ] || "$bin/homing" certs --out "$work/certs" --dcs iad,fra,sin >/dev/null

etcd --name local --data-dir "$work/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster local=http://127.0.0.1:2380 >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -fsS http://127.0.0.1:2379/health >/dev/null 2>&1 && break
  sleep 0.1
done

for dc in iad fra sin; do
  "$bin/homingd" --config "$root/deploy/homingd-$dc.toml" \
    --data-dir "$work/$dc" \
    --ca-cert "$work/certs/ca.pem" --cert "$work/certs/node-$dc.pem" --key "$work/certs/node-$dc.key" \
    >"$work/$dc.out" 2>"$work/$dc.log" &
  pids+=($!)
done
for dc in iad fra sin; do
  for _ in $(seq 1 100); do grep -q "listening on" "$work/$dc.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "listening on" "$work/$dc.out" || { echo "homingd $dc did not start; see $work/$dc.log" >&2; cat "$work/$dc.log" >&2; exit 1; }
done

cat <<EOT
homing cluster running (state in $work):
  iad 127.0.0.1:7401  fra 127.0.0.1:7402  sin 127.0.0.1:7403  (metrics :9401 :9402 :9403)
  global store: etcd at 127.0.0.1:2379, prefix /homing/local

  export HOMING_CERTS=$work/certs HOMING_DCS=iad=127.0.0.1:7401,fra=127.0.0.1:7402,sin=127.0.0.1:7403
  $bin/homing reserve room-1 --actor 10.0.0.1:8080 --at fra
  $bin/homing resolve room-1
  $bin/homing chain room-1
  curl -s http://127.0.0.1:9402/metrics | grep homing_requests_total
  open http://127.0.0.1:9401/ in a browser: the status page (any DC's shows every DC)

Ctrl-C stops everything.
EOT
if [ "${HOMING_CLUSTER_SMOKE:-}" = 1 ]; then
  export HOMING_CERTS=$work/certs HOMING_DCS=iad=127.0.0.1:7401,fra=127.0.0.1:7402,sin=127.0.0.1:7403
  "$bin/homing" reserve "smoke-$$" --actor 10.0.0.1:8080 --at fra
  "$bin/homing" resolve "smoke-$$"
  "$bin/homing" chain "smoke-$$"
  # The status page of iad lists every DC and walks the key's chain.
  page=$(curl -sf "http://127.0.0.1:9401/?key=smoke-$$")
  for dc in iad fra sin; do
    grep -q "data-dc=\"$dc\"" <<<"$page" || { echo "status page lists no $dc" >&2; exit 1; }
  done
  grep -q "tail: active, actor 10.0.0.1:8080" <<<"$page" || { echo "status page shows no chain of smoke-$$" >&2; exit 1; }
  exit 0
fi
wait
