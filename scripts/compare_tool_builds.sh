#!/usr/bin/env bash
# What a tool built by
# scripts/measure_tool_builds.sh costs when it runs, against the installed
# one (~/.cargo/bin), so that a cheaper build can be checked to cost nothing
# that matters.
#
#   scripts/compare_tool_builds.sh /tmp/tool-builds/evcxr-opt1 [--rounds N] [NOTEBOOK]
#   scripts/compare_tool_builds.sh /tmp/tool-builds/mdbook-opt1 [--rounds N]
#
# An evcxr_jupyter build: runs NOTEBOOK (default notebooks/05-bucketing.ipynb)
# through scripts/run_notebooks.py --jobs 1 in a kernel that starts that
# binary (a copy of the installed kernel's launcher, found through
# JUPYTER_PATH; both use this checkout's build folders) and in the installed
# kernel, once to warm the build folders, then alternating N rounds (default
# 2). Each run prints its wall-clock seconds and the CPU seconds of the
# kernel and all it ran, with the load average; the same for a new kernel
# until notebooks/00-introduction.ipynb's first output (notebook_kernel.py
# first-output), whose own line follows.
# An mdbook build: renders the book with it and with the installed mdbook
# into scratch folders, N rounds each, prints the seconds and says whether
# the two books are byte for byte the same (diff -r).
# Nothing installed is changed; the scratch files go in the build's folder.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARGO_BIN="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin"
VENV_PYTHON="$REPO_ROOT/.venv/bin/python"
KERNEL_DIR="$REPO_ROOT/.venv/share/jupyter/kernels/ddp-workbook"

fail() { echo "compare_tool_builds.sh: $*" >&2; exit 2; }

build="" rounds=2 notebook="notebooks/05-bucketing.ipynb"
while (($#)); do
    case "$1" in
        --rounds) rounds="$2"; shift ;;
        -h|--help) sed -n '2,/^$/p' "$0"; exit 0 ;;
        *.ipynb) notebook="$1" ;;
        *) [[ -z "$build" ]] || fail "one build folder at a time (got $build and $1)"; build="$1" ;;
    esac
    shift
done
[[ -n "$build" ]] || fail "name a build folder of scripts/measure_tool_builds.sh, e.g. /tmp/tool-builds/evcxr-opt1"
build="$(cd "$build" && pwd)"
cd "$REPO_ROOT"

load() { cut -d' ' -f1-3 /proc/loadavg; }

# time_it LABEL COMMAND...: runs it, prints LABEL, wall and CPU seconds, load.
time_it() {
    local label="$1" times="$build/compare.times" before
    shift
    before="$(load)"
    TIMEFORMAT='%R %U %S'
    { time "$@" >"$build/compare.log" 2>&1; } 2>"$times" ||
        { tail -20 "$build/compare.log" >&2; fail "$label failed (log: $build/compare.log)"; }
    awk -v label="$label" -v before="$before" -v after="$(load)" \
        '{ printf "%-40s %7.1f s wall %7.1f s CPU   load %s before, %s after\n", label, $1, $2 + $3, before, after }' "$times"
}

compare_evcxr() {
    local binary="$build/root/bin/evcxr_jupyter" jupyter="$build/jupyter" label
    [[ -x "$binary" ]] || fail "no $binary: did scripts/measure_tool_builds.sh finish this build?"
    [[ -f "$KERNEL_DIR/launch.sh" ]] || fail "the kernel is not installed: run scripts/setup.sh"
    # The same kernel name in JUPYTER_PATH, which Jupyter searches before
    # .venv: run_notebooks.py and notebook_kernel.py then start this binary.
    mkdir -p "$jupyter/kernels/ddp-workbook"
    sed "s|$CARGO_BIN/evcxr_jupyter|$binary|g" "$KERNEL_DIR/launch.sh" >"$jupyter/kernels/ddp-workbook/launch.sh"
    grep -q "$binary" "$jupyter/kernels/ddp-workbook/launch.sh" ||
        fail "the installed launcher does not start $CARGO_BIN/evcxr_jupyter"
    sed "s|$KERNEL_DIR/launch.sh|$jupyter/kernels/ddp-workbook/launch.sh|" "$KERNEL_DIR/kernel.json" \
        >"$jupyter/kernels/ddp-workbook/kernel.json"
    echo "$notebook, and notebooks/00-introduction.ipynb until its first output, with the installed"
    echo "evcxr_jupyter and with $binary:"
    time_it "warm-up (installed)" "$VENV_PYTHON" scripts/run_notebooks.py --jobs 1 "$notebook"
    for ((round = 1; round <= rounds; round++)); do
        for label in installed "$(basename "$build")"; do
            local path="" # JUPYTER_PATH: empty for the installed kernel
            [[ "$label" == installed ]] || path="$jupyter"
            time_it "$label, round $round" env JUPYTER_PATH="$path" \
                "$VENV_PYTHON" scripts/run_notebooks.py --jobs 1 "$notebook"
            time_it "$label, round $round, 00's first output" env JUPYTER_PATH="$path" \
                "$VENV_PYTHON" scripts/notebook_kernel.py first-output notebooks/00-introduction.ipynb
            printf '%-40s %s\n' "" "$(grep 'first output after' "$build/compare.log")"
        done
    done
}

compare_mdbook() {
    local binary="$build/root/bin/mdbook" installed
    [[ -x "$binary" ]] || fail "no $binary: did scripts/measure_tool_builds.sh finish this build?"
    installed="$(command -v mdbook || echo "$CARGO_BIN/mdbook")"
    for ((round = 1; round <= rounds; round++)); do
        time_it "installed, round $round" "$installed" build --dest-dir "$build/book-installed" "$REPO_ROOT"
        time_it "$(basename "$build"), round $round" "$binary" build --dest-dir "$build/book-this" "$REPO_ROOT"
    done
    if diff -r "$build/book-installed" "$build/book-this" >"$build/book.diff"; then
        echo "the two books are byte for byte the same ($(find "$build/book-this" -type f | wc -l) files)"
    else
        echo "the two books differ: $(wc -l <"$build/book.diff") lines of diff in $build/book.diff"
        exit 1
    fi
}

if [[ -d "$build/root/bin" && -x "$build/root/bin/evcxr_jupyter" ]]; then compare_evcxr; fi
if [[ -d "$build/root/bin" && -x "$build/root/bin/mdbook" ]]; then compare_mdbook; fi
[[ -x "$build/root/bin/evcxr_jupyter" || -x "$build/root/bin/mdbook" ]] ||
    fail "$build/root/bin holds neither evcxr_jupyter nor mdbook"
