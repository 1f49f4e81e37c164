#!/usr/bin/env bash
# What the link between two nodes costs the gradient
# sync, measured, and what chapter 5's α–β model and chapter 6's simulated
# link predict for the same link. Writes the table that chapter 9 includes,
# chapters/tables/multinode-link.md, with the machine and its load.
#
#   scripts/bench_nodes.sh            (root: it makes 2 nodes, cluster `bench`)
#
# For each cap, 1 and 10 Gbit/s: scripts/nodes.sh caps the links, the
# benchmark examples/bench_link.rs runs as one rank per node under
# scripts/launch.sh and measures over the real link, then runs again in
# this process with the simulated link and the model. The nodes are removed
# at the end, also after a failure or Ctrl-C.

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TABLE=chapters/tables/multinode-link.md
mkdir -p "$(dirname "$TABLE")"
CAPS=(1 10)

why="$(scripts/nodes.sh check)" || { echo "scripts/bench_nodes.sh: $why" >&2; exit 1; }
cargo build --release --quiet --features mpi,nccl --example bench_link
work="$(mktemp -d)"
trap 'scripts/nodes.sh down --name bench; rm -rf "$work"' EXIT
scripts/nodes.sh up --name bench --nodes 2 --slots 1 >/dev/null

load_before="$(cat /proc/loadavg)"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"
rows=() links=()
for gbit in "${CAPS[@]}"; do
    scripts/nodes.sh rate --name bench "${gbit}gbit"
    echo "scripts/bench_nodes.sh: ${gbit} Gbit/s: the run over the nodes, then the simulated link..." >&2
    scripts/launch.sh -np 2 --hostfile /run/ddpwb/bench/hosts \
        target/release/examples/bench_link --backend mpi >"$work/measured-$gbit.txt"
    target/release/examples/bench_link --compare "$work/measured-$gbit.txt" --gbit "$gbit" >"$work/rows-$gbit.txt"
    while IFS= read -r line; do
        case "$line" in
            "|"*) rows+=("$line") ;;
            *) links+=("- $line") ;;
        esac
    done <"$work/rows-$gbit.txt"
done
load_after="$(cat /proc/loadavg)"

cpu="$(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
{
    echo "<!-- Written by scripts/bench_nodes.sh; run it again to refresh (as root). -->"
    echo
    echo "| cap | sync | tokens/s, 2 nodes | after backward, 2 nodes | α–β model, β = cap | α–β model, β measured | after backward, simulated link | tokens/s, simulated link |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    printf '%s\n' "${rows[@]}"
    echo
    printf '%s\n' "${links[@]}"
    echo "- machine: $(nproc) cores ($cpu), Linux $(uname -r); $started"
    echo "- load average (1, 5, 15 min) before: ${load_before% * *}; after: ${load_after% * *}"
} >"$TABLE"
cat "$TABLE"
