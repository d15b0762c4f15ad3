#!/usr/bin/env bash
# The reference runs a refactor of the simulator or of homing-node must keep:
# every scenario with seeds 1 and 2, each run's cost-model table, outcome
# counters, trace hash and invariants (wall-clock figures left out), one
# file per run in OUT. Compare two builds with `diff -r OUT_A OUT_B`.
#   simulations/reference-runs.sh target/release/homing-sim /tmp/ref-new
set -euo pipefail
bin=${1:?usage: reference-runs.sh HOMING_SIM_BINARY OUT_DIR}
out=${2:?usage: reference-runs.sh HOMING_SIM_BINARY OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
report=$(mktemp -d)
trap 'rm -rf "$report"' EXIT
for scenario in simulations/scenarios/*.toml; do
    name=$(basename "$scenario" .toml)
    for seed in 1 2; do
        "$bin" run "$scenario" --seed "$seed" --report "$report/$name-$seed" 2>&1 |
            sed -E 's/, [0-9]+ events\/s//; /^report:/d' >"$out/$name-$seed.txt" &
    done
    wait
done
broken=$(grep -L "invariants: all held" "$out"/*.txt || true)
if [ -n "$broken" ]; then
    printf 'an invariant broke in:\n%s\n' "$broken" >&2
    exit 1
fi
echo "$(ls "$out" | wc -l) runs in $out"
