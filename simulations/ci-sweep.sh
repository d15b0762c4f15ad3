#!/usr/bin/env sh
# Bounded simulator sweep for CI: every scenario over a fixed range of seeds,
# a share of the swarm (scenarios drawn from the seed) and the regression
# seeds (about two minutes on 2 cores once built). A failure prints the seed
# to replay and makes the script exit non-zero. The full swarm run:
#   homing-sim swarm --seeds 1..=2000   (about 30 s on 2 cores)
set -eu
cd "$(dirname "$0")/.."
cargo build --release -p homing-sim
bin="${CARGO_TARGET_DIR:-target}/release/homing-sim"
for scenario in simulations/scenarios/*.toml; do
    case "$scenario" in
        *baseline*) seeds="1..=20" ;;
        # Ten simulated minutes each: about 1 s a seed (waiting), 6 s
        # (nomad) and 19 s (racing) on one core.
        *waiting*) seeds="1..=50" ;;
        *nomad*) seeds="1..=4" ;;
        *racing*) seeds="1..=4" ;;
        # Slow store, 400 hosts: about 1.5 s a seed.
        *watch-lagging*) seeds="1..=20" ;;
        *) seeds="1..=50" ;;
    esac
    # Not piped straight into tail: that would hide a failing sweep's status.
    if ! out=$("$bin" sweep "$scenario" --seeds "$seeds" 2>&1); then
        printf '%s\n' "$out"
        exit 1
    fi
    printf '%s\n' "$out" | tail -n 2
done
# A bounded share of the swarm, then the regression seeds.
if ! out=$("$bin" swarm --seeds 1..=500 2>&1); then
    printf '%s\n' "$out"
    exit 1
fi
printf '%s\n' "$out" | tail -n 2
"$bin" regressions simulations/regressions.txt
