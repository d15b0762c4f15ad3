#!/usr/bin/env bash
# Migration smoke test, as an operator would run it: a devnet leaves redb
# stores in a directory; `homing migrate` copies them into a fresh local etcd,
# a second run finds everything present, and --verify-only agrees. Needs
# `etcd` on PATH; builds the CLI with the etcd feature. Everything listens on
# 127.0.0.1 and is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
etcd_pid=""
cleanup() {
  [[ -n "$etcd_pid" ]] && kill "$etcd_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cargo build -q -p homing-cli --features etcd --bin homing
homing=${CARGO_TARGET_DIR:-target}/debug/homing

"$homing" devnet --data-dir "$work/devnet" >"$work/devnet.log"

port=$((23000 + RANDOM % 2000))
etcd --name migrate-smoke --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
  --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-cluster "migrate-smoke=http://127.0.0.1:$((port + 1))" >"$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.2
done

from="redb:$work/devnet?layout=devnet"
to="etcd:127.0.0.1:$port?prefix=/homing/smoke"
timeout 120 "$homing" migrate --from "$from" --to "$to" --dcs iad,fra,sin
echo "--- again: everything is present"
timeout 120 "$homing" migrate --from "$from" --to "$to" --dcs iad,fra,sin | tail -3
echo "--- verify only"
timeout 120 "$homing" migrate --from "$from" --to "$to" --dcs iad,fra,sin --verify-only | tail -2
