#!/usr/bin/env bash
# Installs everything ddp-workbook needs, once per checkout.
# Run it from anywhere:   scripts/setup.sh
# The short path to chapter 1:   scripts/setup.sh --minimal
#   (steps 1 to 5 only, with PyTorch's CPU-only wheel: what
#   `cargo workbook test 01` and every chapter's tests need; run
#   scripts/setup.sh later for the rest, listed when it ends)
#
# What it does (each step checks first and skips what is already done, so it
# is safe and fast to run again):
#   1. checks the Rust toolchain (cargo 1.94 or newer: .cargo/config.toml uses
#      the `include` key, stable since 1.94);
#   2. checks Python 3 (3.10 or newer, with the venv module);
#   3. creates the project's own virtual environment, .venv/;
#   4. installs PyTorch 2.11.0 into it (the wheel carries libtorch, CUDA and
#      NCCL: about 2.7 GB to download; docs/setup-sizes.md has its size on
#      disk), and safetensors and
#      numpy, with which the tests save PyTorch state_dicts;
#   5. writes .cargo/libtorch.toml (git-ignored), which tells cargo where this
#      machine's libtorch is, so that plain `cargo build` just works;
#   6. links .nccl/libnccl.so to the NCCL pip installed with torch, for the
#      `nccl` feature;
#   7. installs Open MPI and libclang with apt-get (as root, or through
#      sudo), for the `mpi` feature: ranks as processes started by mpirun;
#      and Chromium with its chromedriver, and Selenium in .venv, with
#      which the suite's `browser` check opens the book;
#   8. installs mdBook, the tool that builds the book in chapters/
#      (compiled at opt-level 1: a few minutes on 2 cores);
#   9. renders the book to book/ (open book/index.html);
#  10. runs scripts/setup_notebooks.sh: the Rust Jupyter kernel (evcxr_jupyter,
#      compiled once: the longest step on a bare machine),
#      Jupyter in .venv, and the
#      kernel's crate, prebuilt once so that a notebook's first cell does
#      not compile tch and libtorch's bindings (about 1.5 minutes).
# It prints each step's time ("[3/10] took 12s") and the total.
# To add a step: write a `step_...` function and add its
# name to STEPS and a title to TITLES at the bottom.
#
# It never asks questions, so it runs unattended in CI (CI=true).

set -euo pipefail

MINIMAL=false
for arg in "$@"; do
    case "$arg" in
        --minimal) MINIMAL=true ;;
        -h | --help) sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) printf 'setup.sh: unknown argument %q\n    -> scripts/setup.sh [--minimal]   (--help says what each does)\n' "$arg" >&2; exit 2 ;;
    esac
done

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

# The versions this project is built for. tch 0.24 is made for libtorch
# 2.11.0 exactly (see docs/decisions.md); keep these in step with Cargo.toml.
TORCH_VERSION="2.11.0"
MDBOOK_VERSION="0.5.4"
MIN_CARGO_MINOR=94    # cargo 1.94: `include` in .cargo/config.toml
MIN_PYTHON_MINOR=10   # torch 2.11 wheels exist for Python 3.10 and newer

VENV_DIR="$REPO_ROOT/.venv"
VENV_PYTHON="$VENV_DIR/bin/python"
LIBTORCH_CONFIG="$REPO_ROOT/.cargo/libtorch.toml"

# ---------------------------------------------------------------- helpers

step_number=0
step_total=0

say()  { printf '    %s\n' "$*"; }
done_already() { printf '    ok: %s\n' "$*"; }

# fail WHAT-WENT-WRONG WHAT-TO-DO...: stop with a message a person can act on.
fail() {
    printf '\nsetup.sh: FAILED: %s\n' "$1" >&2
    shift
    for hint in "$@"; do
        printf '    -> %s\n' "$hint" >&2
    done
    exit 1
}

# pip shows a progress bar on a terminal; in CI logs it is only noise.
pip_progress_flag() {
    if [[ -t 1 && -z "${CI:-}" ]]; then echo "--progress-bar=on"; else echo "--progress-bar=off"; fi
}

# ------------------------------------------------------------------ steps

step_rust() {
    command -v cargo >/dev/null 2>&1 ||
        fail "cargo was not found on PATH." \
             "Install Rust with rustup (https://rustup.rs), then open a new shell."
    local version minor
    version="$(cargo --version)"                     # "cargo 1.95.0 (f2d3ce0bd ...)"
    minor="$(sed -E 's/^cargo 1\.([0-9]+).*/\1/' <<<"$version")"
    [[ "$minor" =~ ^[0-9]+$ ]] ||
        fail "could not read the cargo version from '$version'."
    (( minor >= MIN_CARGO_MINOR )) ||
        fail "$version is too old: this project needs cargo 1.$MIN_CARGO_MINOR or newer (older cargo ignores the 'include' in .cargo/config.toml, so it cannot find libtorch)." \
             "Update it: rustup update stable"
    done_already "$version"
}

step_python() {
    command -v python3 >/dev/null 2>&1 ||
        fail "python3 was not found on PATH." \
             "Debian/Ubuntu: sudo apt-get install python3 python3-venv"
    local minor
    minor="$(python3 -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else -1)')"
    (( minor >= MIN_PYTHON_MINOR )) ||
        fail "$(python3 --version 2>&1) is too old: torch $TORCH_VERSION needs Python 3.$MIN_PYTHON_MINOR or newer." \
             "Install a newer Python 3 and make it the python3 on PATH."
    done_already "$(python3 --version 2>&1) at $(command -v python3)"
}

# A usable venv: its python runs and has pip. A half-made one (interrupted,
# or its base Python was removed) is rebuilt.
venv_is_usable() {
    [[ -x "$VENV_PYTHON" ]] && "$VENV_PYTHON" -m pip --version >/dev/null 2>&1
}

step_venv() {
    if venv_is_usable; then
        done_already ".venv exists ($("$VENV_PYTHON" --version 2>&1))"
        return
    fi
    if [[ -e "$VENV_DIR" ]]; then
        say ".venv exists but is broken (no working python or pip): rebuilding it"
        rm -rf "$VENV_DIR"
    fi
    # Debian splits ensurepip (needed by `python3 -m venv`) into python3-venv.
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 ||
        fail "Python's venv module is not installed (python3 -m venv needs ensurepip)." \
             "Debian/Ubuntu: sudo apt-get install python3-venv" \
             "(if that is not enough: sudo apt-get install python3.$(python3 -c 'import sys; print(sys.version_info[1])')-venv)"
    say "creating .venv with $(python3 --version 2>&1)"
    python3 -m venv "$VENV_DIR" ||
        fail "python3 -m venv .venv failed (see the message above)." \
             "Debian/Ubuntu: sudo apt-get install python3-venv, then run scripts/setup.sh again."
    venv_is_usable ||
        fail ".venv was created but its pip does not work." \
             "Delete .venv and run scripts/setup.sh again."
    done_already ".venv created"
}

# The installed torch version, read from the package metadata (importing
# torch itself takes seconds); empty when torch is not installed.
installed_torch_version() {
    "$VENV_PYTHON" - <<'EOF' 2>/dev/null || true
import importlib.metadata as metadata
try:
    print(metadata.version("torch"))
except metadata.PackageNotFoundError:
    pass
EOF
}

step_torch() {
    local have
    have="$(installed_torch_version)"
    # "2.11.0" or, for some wheels, "2.11.0+cu130" / "2.11.0+cpu".
    # safetensors (with numpy, which its save_file needs) writes the PyTorch
    # state_dicts that tests/torch_checkpoint.rs loads into the workbook.
    if [[ "$have" == *+cpu ]]; then
        say "note: torch $have is the CPU-only wheel (scripts/setup.sh --minimal installs it); chapter 10's GPUs and"
        say "      the nccl feature need PyPI's: .venv/bin/python -m pip install --force-reinstall torch==$TORCH_VERSION"
    fi
    if [[ "${have%%+*}" == "$TORCH_VERSION" ]] && "$VENV_PYTHON" -c 'import safetensors, numpy' 2>/dev/null; then
        done_already "torch $have, safetensors and numpy are installed in .venv"
        return
    fi
    if [[ -n "$have" && "${have%%+*}" != "$TORCH_VERSION" ]]; then
        say "torch $have is installed, but this project needs $TORCH_VERSION: replacing it"
    fi
    say "installing torch==$TORCH_VERSION into .venv"
    say "(about 2.7 GB to download with its CUDA libraries, about 5 GB on disk; a few minutes on a fast link)"
    "$VENV_PYTHON" -m pip install --no-input "$(pip_progress_flag)" "torch==$TORCH_VERSION" safetensors==0.8.0 numpy==2.4.6 ||
        fail "pip could not install torch==$TORCH_VERSION (see pip's message above)." \
             "Check the network and free disk space (about 10 GB during the install), then run scripts/setup.sh again."
    have="$(installed_torch_version)"
    [[ "${have%%+*}" == "$TORCH_VERSION" ]] ||
        fail "after the install, .venv has torch '$have', not $TORCH_VERSION."
    done_already "torch $have installed"
}

# --minimal: only torch, and its CPU-only wheel (about a tenth of the
# download: no CUDA, no NCCL), which is all libtorch the chapters' tests
# need. Where PyTorch's CPU index cannot be reached (a mirror of PyPI only,
# say), the default wheel instead.
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"

step_torch_minimal() {
    local have
    have="$(installed_torch_version)"
    if [[ "${have%%+*}" == "$TORCH_VERSION" ]]; then
        done_already "torch $have is installed in .venv"
        return
    fi
    say "installing torch==$TORCH_VERSION, CPU only, from $TORCH_CPU_INDEX"
    if ! "$VENV_PYTHON" -m pip install --no-input "$(pip_progress_flag)" --retries 1 --timeout 30 \
        --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION"; then
        say "the CPU-only wheel could not be installed (above); installing the default wheel instead (about 2.7 GB)"
        "$VENV_PYTHON" -m pip install --no-input "$(pip_progress_flag)" "torch==$TORCH_VERSION" ||
            fail "pip could not install torch==$TORCH_VERSION (see pip's message above)." \
                 "Check the network and free disk space, then run scripts/setup.sh --minimal again."
    fi
    have="$(installed_torch_version)"
    [[ "${have%%+*}" == "$TORCH_VERSION" ]] ||
        fail "after the install, .venv has torch '$have', not $TORCH_VERSION."
    done_already "torch $have installed"
}

# The folder of the torch package: libtorch's lib/ and include/ are inside.
# find_spec locates it without importing torch.
torch_dir() {
    "$VENV_PYTHON" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))'
}

step_libtorch_config() {
    local dir
    dir="$(torch_dir)" || fail "the python in .venv cannot find the torch package." \
                               "Delete .venv and run scripts/setup.sh again."
    [[ -f "$dir/lib/libtorch_cpu.so" && -d "$dir/include/torch" ]] ||
        fail "$dir does not hold libtorch (lib/libtorch_cpu.so and include/torch are missing)." \
             "Delete .venv and run scripts/setup.sh again."
    # A TOML basic string; json.dumps escapes exactly what TOML needs.
    local wanted
    wanted="$("$VENV_PYTHON" - "$dir" <<'EOF'
import json, sys
print("# Written by scripts/setup.sh: where this machine's libtorch is.")
print("# Do not commit (git-ignored); run scripts/setup.sh again if .venv moves.")
print("[env]")
print("LIBTORCH = { value = %s }" % json.dumps(sys.argv[1]))
EOF
)"
    if [[ -f "$LIBTORCH_CONFIG" && "$(cat "$LIBTORCH_CONFIG")" == "$wanted" ]]; then
        done_already ".cargo/libtorch.toml points at $dir"
        return
    fi
    printf '%s\n' "$wanted" > "$LIBTORCH_CONFIG.tmp"
    mv "$LIBTORCH_CONFIG.tmp" "$LIBTORCH_CONFIG"
    done_already "wrote .cargo/libtorch.toml: LIBTORCH = $dir"
}

# The nccl feature loads NCCL through cudarc, which opens `libnccl.so`; pip
# installs NCCL with torch as a wheel of its own (nvidia-nccl-cu13), whose
# library is nvidia/nccl/lib/libnccl.so.2, next to torch. A link under
# the project's own .nccl/ gives it that name without touching .venv; the
# binaries look in .nccl/ (build.rs bakes it in as an rpath).
step_nccl_link() {
    local dir target link="$REPO_ROOT/.nccl/libnccl.so"
    dir="$(torch_dir)"
    target="$(cd "$dir/.." && pwd)/nvidia/nccl/lib/libnccl.so.2"
    if [[ ! -f "$target" ]]; then
        say "pip installed no NCCL with this torch ($target): the nccl feature will say so at run time"
        return
    fi
    if [[ -L "$link" && "$(readlink "$link")" == "$target" ]]; then
        done_already ".nccl/libnccl.so -> $target"
        return
    fi
    mkdir -p "$REPO_ROOT/.nccl"
    ln -sfn "$target" "$link"
    done_already "linked .nccl/libnccl.so -> $target"
}

# Where `cargo install` puts binaries.
CARGO_BIN="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin"

# mdBook compiled at opt-level 1, not release's 3: less CPU, and the same
# book in the same second (docs/tool-builds.md and docs/benchmarks.md: the numbers and the
# commands). An mdbook 0.5.4 already installed, however compiled, is kept.
MDBOOK_BUILD_ENV=(CARGO_PROFILE_RELEASE_OPT_LEVEL=1)

step_mdbook() {
    local mdbook have=""
    mdbook="$(command -v mdbook || echo "$CARGO_BIN/mdbook")"
    if [[ -x "$mdbook" ]]; then
        have="$("$mdbook" --version 2>/dev/null || true)"   # "mdbook v0.5.4"
    fi
    if [[ "$have" == "mdbook v$MDBOOK_VERSION" ]]; then
        done_already "$have ($mdbook)"
    else
        [[ -n "$have" ]] && say "found $have; this project pins mdbook $MDBOOK_VERSION: replacing it"
        say "installing mdbook $MDBOOK_VERSION with ${MDBOOK_BUILD_ENV[*]} cargo install (compiles it: a few minutes on 2 cores)"
        env "${MDBOOK_BUILD_ENV[@]}" cargo install mdbook --version "$MDBOOK_VERSION" --locked ||
            fail "cargo install mdbook --version $MDBOOK_VERSION --locked failed (see above)."
        done_already "mdbook $MDBOOK_VERSION installed in $CARGO_BIN"
    fi
    if ! command -v mdbook >/dev/null 2>&1; then
        say "note: $CARGO_BIN is not on your PATH; add it to run \`mdbook serve\` by name:"
        say "      export PATH=\"$CARGO_BIN:\$PATH\"   (scripts/test.sh finds it either way)"
    fi
}

# The book, rendered once, so that a learner can read it without a server:
# open book/index.html. (`mdbook serve --open` rebuilds it live while you
# edit.) Cheap, so it runs every time: the pages change with the code.
step_book() {
    local mdbook
    mdbook="$(command -v mdbook || echo "$CARGO_BIN/mdbook")"
    "$mdbook" build "$REPO_ROOT" >/dev/null 2>&1 ||
        fail "mdbook build failed; run it yourself to see why: $mdbook build" \
             "the book's sources are chapters/ (book.toml at the repository root)"
    done_already "the book is in book/: open book/index.html (live: mdbook serve --open)"
}

# The notebooks' own set-up (evcxr_jupyter, Jupyter in .venv, the kernel)
# lives in its own script, which notebooks/README.md documents.
step_notebooks() {
    if [[ ! -f "$REPO_ROOT/scripts/setup_notebooks.sh" ]]; then
        done_already "no scripts/setup_notebooks.sh in this checkout: nothing to do"
        return
    fi
    say "running scripts/setup_notebooks.sh"
    bash "$REPO_ROOT/scripts/setup_notebooks.sh" ||
        fail "scripts/setup_notebooks.sh failed (see its message above)."
}

# Open MPI (mpirun, mpicc and the headers) and libclang, which the `mpi`
# crate's build uses to read mpi.h; and Chromium and its chromedriver, in
# which the suite's `browser` check opens the book through Selenium (about
# 50 s more on a fresh machine). Debian and Ubuntu package names.
MPI_PACKAGES=(openmpi-bin libopenmpi-dev libclang-dev chromium chromium-driver)
SELENIUM_VERSION=4.51.0

# Selenium (pip, into .venv: no root needed), pinned like the other packages.
ensure_selenium() {
    local have
    have="$("$VENV_PYTHON" -c 'import selenium; print(selenium.__version__)' 2>/dev/null || true)"
    [[ "$have" == "$SELENIUM_VERSION" ]] && return
    say "installing selenium==$SELENIUM_VERSION into .venv (the browser check drives Chromium with it)"
    "$VENV_PYTHON" -m pip install --no-input "$(pip_progress_flag)" "selenium==$SELENIUM_VERSION" ||
        fail "pip could not install selenium==$SELENIUM_VERSION (see pip's message above)." \
             "Check the network, then run scripts/setup.sh again."
}

step_mpi() {
    ensure_selenium
    if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1 &&
        compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null && command -v chromium >/dev/null 2>&1 &&
        command -v chromedriver >/dev/null 2>&1; then
        done_already "$(mpirun --version 2>/dev/null | head -1), mpicc, libclang, $(chromium --version 2>/dev/null), chromedriver and selenium $SELENIUM_VERSION"
        return
    fi
    local sudo=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null 2>&1 ||
            fail "Open MPI is missing, and installing it needs root (this is not root, and there is no sudo)." \
                 "Ask an administrator to run: apt-get install ${MPI_PACKAGES[*]}" \
                 "Without MPI everything but the \`mpi\` feature works: scripts/test.sh --skip mpi"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null 2>&1 ||
        fail "Open MPI is missing, and this system has no apt-get." \
             "Install Open MPI (mpirun, mpicc, headers) and libclang with your package manager, then run scripts/setup.sh again."
    say "installing ${MPI_PACKAGES[*]} with ${sudo[*]:-} apt-get"
    "${sudo[@]}" apt-get update -qq ||
        fail "apt-get update failed (see above)." "Check the network, or run it yourself: ${sudo[*]:-} apt-get update"
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${MPI_PACKAGES[@]}" >/dev/null ||
        fail "apt-get install ${MPI_PACKAGES[*]} failed (see above)." \
             "Run it yourself to see why: ${sudo[*]:-} apt-get install ${MPI_PACKAGES[*]}"
    done_already "$(mpirun --version 2>/dev/null | head -1)"
}

# ------------------------------------------------------------------- main

STEPS=(rust python venv torch libtorch_config nccl_link mpi mdbook book notebooks)
TITLES=(
    "Rust toolchain"
    "Python 3"
    "virtual environment .venv"
    "PyTorch $TORCH_VERSION (libtorch) in .venv"
    "tell cargo where libtorch is (.cargo/libtorch.toml)"
    "NCCL under the name cudarc loads (.nccl/libnccl.so)"
    "Open MPI and libclang (the mpi feature), Chromium (the browser check)"
    "mdBook $MDBOOK_VERSION (builds the book)"
    "the book, rendered to book/"
    "notebooks: evcxr_jupyter, Jupyter and the Rust kernel"
)

if $MINIMAL; then
    STEPS=(rust python venv torch_minimal libtorch_config)
    TITLES=(
        "Rust toolchain"
        "Python 3"
        "virtual environment .venv"
        "PyTorch $TORCH_VERSION (libtorch), CPU only, in .venv"
        "tell cargo where libtorch is (.cargo/libtorch.toml)"
    )
fi

start_seconds=$SECONDS
step_total=${#STEPS[@]}
echo "ddp-workbook set-up$($MINIMAL && echo " (--minimal)") in $REPO_ROOT"
for i in "${!STEPS[@]}"; do
    step_number=$((i + 1))
    printf '\n==> [%d/%d] %s\n' "$step_number" "$step_total" "${TITLES[$i]}"
    step_started=$SECONDS
    "step_${STEPS[$i]}"
    # Each step's time, so that a set-up's log says what it was made of
    # (cargo xtask waits --ci-log reads these lines).
    printf '    [%d/%d] took %ds\n' "$step_number" "$step_total" $((SECONDS - step_started))
done
printf '\nSet-up complete in %ds (load average %s).\n' \
    $((SECONDS - start_seconds)) "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"

if $MINIMAL; then
    cat <<EOF

Next: cargo workbook test 01
(its first build compiles tch and libtorch's C++ bindings, once; then read
chapters/01-collectives.md and write src/ch01_collectives/exercise.rs).

scripts/setup.sh without --minimal adds, when you need them:
  - safetensors and numpy in .venv: the tests that load PyTorch's own files;
  - the NCCL link and the GPU wheel: chapter 10 on a GPU (see the note it prints);
  - Open MPI and libclang: the mpi feature, ranks as processes (chapter 9);
    Chromium: the suite's browser check;
  - mdBook: the book rendered to book/ (the pages read as Markdown in chapters/);
  - evcxr_jupyter and Jupyter: the notebooks in notebooks/.
EOF
    exit 0
fi

# End where a learner starts: where each chapter stands, and the book.
printf '\nWhere each chapter stands (cargo workbook):\n'
cargo workbook ||
    fail "cargo workbook could not list the chapters (see above)." \
         "Run it yourself to see why: cargo workbook"
printf '\nThe book: %s/book/index.html\n' "$REPO_ROOT"
printf 'Start with chapter 1: read its page, then run  cargo workbook test 01\n'
printf 'The whole suite, as CI runs it: scripts/test.sh\n'
