#!/usr/bin/env bash
# How long `cargo install` takes to compile the
# two tools a bare machine's set-up builds (evcxr_jupyter and mdbook), under
# the profiles scripts/setup.sh could use. Nothing installed is touched: each
# variant builds into its own scratch folders under $SCRATCH (default
# /tmp/tool-builds), which are deleted first, so every build starts cold.
#
#   scripts/measure_tool_builds.sh                 # every variant, one after another
#   scripts/measure_tool_builds.sh evcxr-opt1 mdbook-opt1
#   scripts/measure_tool_builds.sh --list          # the variants' names
#
# Downloads are not counted: the registry cache in ~/.cargo is shared, and the
# crates are already there on a machine that installed the tools once (on a
# bare machine they add the download time: a few MB).
# Each line gives the wall-clock seconds, the CPU seconds (what compiling
# costs, whatever else runs), the 1-minute load average sampled every 5 s
# during the build (its mean and maximum: other builds on the same cores slow
# the wall clock down), and the command. With --markdown FILE the lines also
# go to FILE as rows of a table (appended when FILE exists).

set -euo pipefail

EVCXR="evcxr_jupyter@0.22.0"
MDBOOK="mdbook@0.5.4"
SCRATCH="${SCRATCH:-/tmp/tool-builds}"

# name | crates | environment (profile overrides) | extra cargo install flags
VARIANTS=(
    "evcxr-release|$EVCXR||"
    "evcxr-opt1|$EVCXR|CARGO_PROFILE_RELEASE_OPT_LEVEL=1|"
    "evcxr-opt0|$EVCXR|CARGO_PROFILE_RELEASE_OPT_LEVEL=0|"
    "evcxr-debug|$EVCXR||--debug"
    "mdbook-release|$MDBOOK||"
    "mdbook-opt1|$MDBOOK|CARGO_PROFILE_RELEASE_OPT_LEVEL=1|"
    "mdbook-opt0|$MDBOOK|CARGO_PROFILE_RELEASE_OPT_LEVEL=0|"
    "both-release|$MDBOOK $EVCXR||"
    "both-opt1|$MDBOOK $EVCXR|CARGO_PROFILE_RELEASE_OPT_LEVEL=1|"
)

markdown=""
chosen=()
while (($#)); do
    case "$1" in
        --list) for v in "${VARIANTS[@]}"; do echo "${v%%|*}"; done; exit 0 ;;
        --markdown) markdown="$2"; shift ;;
        -h|--help) sed -n '2,/^$/p' "$0"; exit 0 ;;
        *) chosen+=("$1") ;;
    esac
    shift
done
if ((${#chosen[@]} == 0)); then
    for v in "${VARIANTS[@]}"; do chosen+=("${v%%|*}"); done
fi

load1() { cut -d' ' -f1 /proc/loadavg; }

# sample_load FILE: appends the 1-minute load average to FILE every 5 s until killed.
sample_load() {
    while true; do load1 >>"$1"; sleep 5; done
}

# A new FILE gets a header; an existing one gets more rows, so that runs
# interleaved with one another (to compare variants under the same load)
# fill one table.
if [[ -n "$markdown" && ! -s "$markdown" ]]; then
    {
        echo "<!-- Written by scripts/measure_tool_builds.sh --markdown FILE (rows appended by each run); do not edit by hand. -->"
        echo
        echo "Cold \`cargo install\` builds on $(nproc) cores, $(date -u '+%Y-%m-%d'); downloads not counted (the registry cache was warm). Under load the CPU seconds compare the variants; on an idle machine the wall clock is at least half of them."
        echo
        echo "| variant | wall-clock seconds | CPU seconds | load average during (mean, max) | command |"
        echo "| --- | --- | --- | --- | --- |"
    } >"$markdown"
fi

for name in "${chosen[@]}"; do
    spec=""
    for v in "${VARIANTS[@]}"; do [[ "${v%%|*}" == "$name" ]] && spec="$v"; done
    [[ -n "$spec" ]] || { echo "measure_tool_builds.sh: no variant '$name' (see --list)" >&2; exit 2; }
    IFS='|' read -r _ crates envs flags <<<"$spec"
    dir="$SCRATCH/$name"
    rm -rf "$dir"
    mkdir -p "$dir"
    command="${envs:+$envs }CARGO_TARGET_DIR=$dir/target cargo install --locked --root $dir/root ${flags:+$flags }$crates"
    loads="$dir/loads"
    load1 >"$loads"
    sample_load "$loads" &
    sampler=$!
    # `time` gives the wall-clock seconds and the CPU seconds (user and
    # system) of cargo and every compiler it ran; under load the CPU seconds
    # compare variants better, and on an idle 2-core machine the wall clock
    # is about half of them (less where one large crate compiles alone).
    TIMEFORMAT='%R %U %S'
    # shellcheck disable=SC2086  # envs, flags and crates are word lists
    if ! { time env $envs CARGO_TARGET_DIR="$dir/target" cargo install --quiet --locked --root "$dir/root" \
        $flags $crates >"$dir/log" 2>&1; } 2>"$dir/times"; then
        kill "$sampler"
        echo "measure_tool_builds.sh: $name failed; its log: $dir/log" >&2
        tail -20 "$dir/log" >&2
        exit 1
    fi
    kill "$sampler"
    load1 >>"$loads"
    read -r wall user system <"$dir/times"
    read -r wall cpu < <(awk -v w="$wall" -v u="$user" -v s="$system" 'BEGIN { printf "%.0f %.0f\n", w, u + s }')
    read -r mean max < <(awk '{ s += $1; if ($1 > m) m = $1 } END { printf "%.1f %.1f\n", s / NR, m }' "$loads")
    printf '%-15s %6d s wall %6d s CPU   load %s mean, %s max   %s\n' "$name" "$wall" "$cpu" "$mean" "$max" "$command"
    if [[ -n "$markdown" ]]; then
        printf '| %s | %d | %d | %s, %s | `%s` |\n' "$name" "$wall" "$cpu" "$mean" "$max" "$command" >>"$markdown"
    fi
done
