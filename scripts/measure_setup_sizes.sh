#!/usr/bin/env bash
# What scripts/setup.sh put on this machine, and how much disk each part
# takes, measured here (du for folders and files, dpkg-query for apt
# packages), not estimated. Nothing is installed, removed or changed.
#
#   scripts/measure_setup_sizes.sh                                # prints the table
#   scripts/measure_setup_sizes.sh --markdown docs/setup-sizes.md # also writes it there
#
# Rows: the virtual environment .venv and the biggest parts of it (torch,
# the CUDA libraries and Triton that pip installs with it), pip's cache (and
# the torch wheel in it, if pip kept one), mdBook's and evcxr_jupyter's
# binaries, rust-src, the rendered book, the notebook kernel's build folders
# (its prebuilt seed, and one per kernel that ever ran beside another), and
# the apt packages set-up installs (read from scripts/setup.sh), each on its
# own, then what apt installed with them. The build folders are not set-up's
# (kernels make them as they run) but are counted: a learner's machine has
# them after the first notebooks. Sizes are in MiB and GiB (2^20 and 2^30
# bytes). With --markdown FILE the table goes to FILE (replaced: it is a
# snapshot of this machine), under a comment naming the command, with the
# machine, the date, the load average before and after, and the command.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

# The command as a reader would type it again, for the table's caption.
COMMAND="scripts/measure_setup_sizes.sh${*:+ $*}"

markdown=""
while (($#)); do
    case "$1" in
        --markdown) [[ $# -ge 2 ]] || { echo "measure_setup_sizes.sh: --markdown needs a FILE" >&2; exit 2; }
                    markdown="$2"; shift ;;
        -h|--help) sed -n '2,/^$/p' "$0"; exit 0 ;;
        *) echo "measure_setup_sizes.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

VENV_PYTHON="$REPO_ROOT/.venv/bin/python"
if [[ ! -x "$VENV_PYTHON" ]]; then
    echo "measure_setup_sizes.sh: $REPO_ROOT/.venv does not exist (or has no bin/python): set-up has not been run in this checkout, so there is nothing to measure." >&2
    echo "    -> run scripts/setup.sh first, then this script again" >&2
    exit 1
fi

CARGO_BIN="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin"
LAUNCHER="$REPO_ROOT/.venv/share/jupyter/kernels/ddp-workbook/launch.sh"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
started=$SECONDS

# Each row: what | where (Markdown) | KiB ("" when there is nothing to
# measure: the note then stands in the size column) | note | kind: "" counts in the total; "part" lies inside the row above it (shown
# indented, "of it, ..."), and "apart" is shown but not set-up's: neither
# counts in the total.
ROWS=()
row() { ROWS+=("$1|$2|$3|${4:-}|${5:-}"); }
part() { ROWS+=("$1|$2|$3|${4:-}|part"); }

# KiB on disk under PATH, as du counts it (one du per path: a single du
# given nested paths counts each file once, under the first).
kib() { du -sk "$1" 2>/dev/null | cut -f1; }

# Paths as a reader sees them, in backticks: under the checkout relative,
# under $HOME with ~, a folder with a trailing slash.
shown() {
    local path="$1"
    [[ -d "$path" ]] && path="$path/"
    path="${path#"$REPO_ROOT"/}"
    [[ "$path" == "$HOME"/* ]] && path="~/${path#"$HOME"/}"
    printf '`%s`\n' "$path"
}

# row_for WHAT PATH [KIND]: a row measuring PATH, or saying it is absent.
row_for() {
    if [[ -e "$2" ]]; then
        row "$1" "$(shown "$2")" "$(kib "$2")" "" "${3:-}"
    else
        row "$1" "$(shown "$2")" "" "not there" "${3:-}"
    fi
}

# ------------------------------------------------------------ .venv and pip

row_for "the virtual environment, in all" "$REPO_ROOT/.venv"
site_packages="$("$VENV_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
torch_dir="$("$VENV_PYTHON" -c 'import importlib.util, os; s = importlib.util.find_spec("torch"); print(os.path.dirname(s.origin) if s else "")')"
if [[ -n "$torch_dir" ]]; then
    torch_version="$("$VENV_PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))')"
    row_for "PyTorch $torch_version (the torch package: libtorch, its headers)" "$torch_dir" part
else
    part "PyTorch" "$(shown "$site_packages/torch")" "" "not installed"
fi
# pip installs CUDA, cuDNN and NCCL as nvidia-* wheels beside torch, and Triton.
[[ -d "$site_packages/nvidia" ]] &&
    row_for "the CUDA libraries and NCCL pip installed with torch (nvidia-*)" "$site_packages/nvidia" part
[[ -d "$site_packages/triton" ]] &&
    row_for "Triton, installed with torch" "$site_packages/triton" part

# pip's cache, where it keeps what it downloaded; the torch wheel in it is
# found by content (a zip holding torch-*.dist-info/WHEEL), since pip names
# its cached files by hash. set-up does not ask pip to keep or drop it.
pip_cache="$("$VENV_PYTHON" -m pip cache dir 2>/dev/null || true)"
if [[ -n "$pip_cache" && -d "$pip_cache" ]]; then
    row "pip's cache" "$(shown "$pip_cache")" "$(kib "$pip_cache")"
    torch_wheel="$("$VENV_PYTHON" - "$pip_cache" <<'EOF'
import os, re, sys, zipfile
for folder, _, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(folder, name)
        if os.path.getsize(path) < 100 * 2**20 or not zipfile.is_zipfile(path):
            continue
        with zipfile.ZipFile(path) as wheel:
            if any(re.fullmatch(r"torch-[^/]+\.dist-info/WHEEL", n) for n in wheel.namelist()):
                print(path)
EOF
)"
    if [[ -n "$torch_wheel" ]]; then
        while IFS= read -r wheel; do
            part "a torch wheel" "$(shown "$wheel")" "$(kib "$wheel")"
        done <<<"$torch_wheel"
    else
        part "a torch wheel" "$(shown "$pip_cache")" "" "none in the cache"
    fi
else
    row "pip's cache (pip kept nothing, or its cache is off)" "${pip_cache:+$(shown "$pip_cache")}" "" "not there"
fi

# ------------------------------------------------------------ Rust tools

row_for "mdBook's binary" "$CARGO_BIN/mdbook"
row_for "evcxr_jupyter's binary (the notebooks' kernel)" "$CARGO_BIN/evcxr_jupyter"
# rust-src: set-up adds it for evcxr's type inference.
row_for "rust-src, the standard library's source" "$(rustc --print sysroot)/lib/rustlib/src"
row_for "the book, rendered" "$REPO_ROOT/book"

# --------------------------------------------- the notebook kernel's folders

# The launcher that set-up wrote says where this checkout's seed is (its
# --print-seed); the build folders lie beside the seed, one per kernel that
# ran at the same time as another (build-0, build-1, ...).
if [[ -f "$LAUNCHER" ]] && seed="$(bash "$LAUNCHER" --print-seed | sed -n 1p)" && [[ -n "$seed" ]]; then
    cache="$(dirname "$seed")"
    row_for "the kernel's prebuilt crate (the seed every build folder starts from)" "$seed"
    for build in "$cache"/build-[0-9]*; do
        [[ -d "$build" ]] && row_for "a kernel's build folder" "$build"
    done
    # Other checkouts on this machine have folders of their own beside it.
    others=0
    for folder in "$(dirname "$cache")"/*/; do
        [[ "${folder%/}" != "$cache" ]] && others=$((others + 1))
    done
    if ((others > 0)); then
        row "the kernel folders of $others other checkout(s) on this machine" "$(shown "$(dirname "$cache")")" \
            "$(( $(kib "$(dirname "$cache")") - $(kib "$cache") ))" "theirs: not counted" apart
    fi
else
    row "the notebook kernel's folders (its launcher is missing: scripts/setup_notebooks.sh has not run)" "$(shown "$LAUNCHER")" "" "not there"
fi

# ---------------------------------------------------------------- apt

# The packages set-up asks apt for, read from scripts/setup.sh itself.
packages="$(sed -n -E 's/^MPI_PACKAGES=\((.*)\)$/\1/p' scripts/setup.sh)"
[[ -n "$packages" ]] || {
    echo "measure_setup_sizes.sh: could not read MPI_PACKAGES=(...) from scripts/setup.sh (renamed?)" >&2
    exit 1
}
read -r -a packages <<<"$packages"

if command -v dpkg-query >/dev/null 2>&1; then
    installed=()
    for package in "${packages[@]}"; do
        # Installed-Size: the package's own files, in KiB, as its maintainer
        # measured them; what it depends on is in the row after these.
        size="$(dpkg-query -W -f='${db:Status-Abbrev}|${Installed-Size}' "$package" 2>/dev/null || true)"
        if [[ "$size" == ii* ]]; then
            row "apt package \`$package\` (its own files)" "apt" "${size#*|}"
            installed+=("$package")
        else
            row "apt package \`$package\`" "apt" "" "not installed"
        fi
    done
    # What apt installed with them: the packages that purging them would
    # also remove (marked automatic, needed by nothing else installed),
    # less those that nothing needs already. Simulated (-s): nothing changes.
    if ((${#installed[@]} > 0)); then
        purged() { apt-get -s "$@" 2>/dev/null | sed -n -E 's/^Purg ([^ ]+).*/\1/p' | sort -u; }
        with_them="$(comm -23 <(purged purge --autoremove "${installed[@]}") \
            <({ purged autoremove --purge; printf '%s\n' "${installed[@]}"; } | sort -u))"
        count=0 sum=0
        if [[ -n "$with_them" ]]; then
            count="$(wc -l <<<"$with_them")"
            # shellcheck disable=SC2046  # one package name a word
            sum="$(dpkg-query -W -f='${Installed-Size}\n' $(tr '\n' ' ' <<<"$with_them") | awk '{ s += $1 } END { print s + 0 }')"
        fi
        row "what apt installed with them: $count packages that nothing else installed needs" "apt" "$sum"
    fi
else
    row "the apt packages (${packages[*]})" "apt" "" "no dpkg-query here"
fi

# ---------------------------------------------------------------- the table

# human KiB: MiB, or GiB from 1 GiB on, or KiB under 1 MiB.
human() {
    awk -v k="$1" 'BEGIN {
        if (k >= 1048576) printf "%.2f GiB", k / 1048576
        else if (k >= 1024) printf "%.0f MiB", k / 1024
        else printf "%d KiB", k }'
}

total=0
table="| what | where | size |
| --- | --- | ---: |"
for r in "${ROWS[@]}"; do
    IFS='|' read -r what where size note kind <<<"$r"
    if [[ -n "$size" ]]; then
        shown_size="$(human "$size")"
        [[ -n "$kind" ]] || total=$((total + size))
        [[ -n "$note" ]] && what="$what ($note)"
    else
        shown_size="$note"
    fi
    [[ "$kind" == part ]] && what="&nbsp;&nbsp;of it, $what"
    table+=$'\n'"| $what | $where | $shown_size |"
done
table+=$'\n'"| **in all** (the rows above, less those marked \"of it\" or not counted) | | **$(human "$total")** |"

machine="$(nproc) cores ($(sed -n -E 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), Linux $(uname -r)"
caption="- sizes on disk: du -sk for folders and files, dpkg-query's Installed-Size for apt packages; MiB and GiB are 2^20 and 2^30 bytes
- machine: $machine; $(date -u '+%Y-%m-%d %H:%M UTC')
- load average (1, 5, 15 min) before: $load_before; after: $(cut -d' ' -f1-3 /proc/loadavg)
- \`$COMMAND\` took $((SECONDS - started)) s"

printf '%s\n\n%s\n' "$table" "$caption"
if [[ -n "$markdown" ]]; then
    printf '<!-- Written by `%s`; run it again to refresh, do not edit by hand. -->\n\nWhat scripts/setup.sh put on this machine, with the build folders the notebooks'"'"' kernels made since, and the disk each takes.\n\n%s\n\n%s\n' \
        "$COMMAND" "$table" "$caption" >"$markdown"
    echo "wrote $markdown"
fi
