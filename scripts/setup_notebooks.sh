#!/usr/bin/env bash
# Installs what the notebooks in notebooks/ need,
# once per checkout. scripts/setup.sh calls it as its last step; to run it
# alone (after scripts/setup.sh has made .venv and .cargo/libtorch.toml):
#     scripts/setup_notebooks.sh
#
# What it does (each step checks first and skips what is already done):
#   1. installs the Jupyter kernel for Rust, evcxr_jupyter, at the pinned
#      version with `cargo install --locked` (compiles it: the longest step
#      on a bare machine, see docs/tool-builds.md; skipped when that
#      version is installed);
#   2. adds rustup's rust-src component (evcxr needs it to infer the types of
#      variables carried from one cell to the next);
#   3. installs Jupyter (JupyterLab, nbclient, nbformat, pinned) into .venv;
#   4. registers the kernel "Rust (ddp-workbook)" inside .venv, with
#      libtorch's path in its environment: a notebook compiles the crate with
#      its own cargo, which never sees our .cargo/config.toml or build.rs's
#      rpath, so the kernel itself must tell it where libtorch is.
#   5. prebuilds the crate the notebooks' first cell compiles (tch and
#      libtorch's bindings: about 1.5 minutes on 2 cores, once) into the
#      kernel's seed folder, ~/.cache/ddp-workbook/evcxr/CHECKOUT/seed (one
#      per checkout: NAME-HASH, the checkout folder's name and a hash of its
#      path), with scripts/notebook_kernel.py prebuild: the launcher starts
#      each new build folder as a copy of it, so a learner's first notebook
#      shows its first output in seconds (skipped while the seed is up to
#      date).
# Then scripts/jupyter.sh opens Jupyter, and scripts/run_notebooks.py runs
# every notebook as CI does. notebooks/README.md explains the whole set-up.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

# evcxr_jupyter 0.22.0 needs Rust 1.95. Keep these in step with
# notebooks/README.md.
EVCXR_VERSION="0.22.0"
EVCXR_MIN_RUST_MINOR=95
JUPYTER_PACKAGES=("jupyterlab==4.6.6" "nbclient==0.11.0" "nbformat==5.11.1")
# evcxr_jupyter keeps the release profile: at opt-level 1 or 0 it compiled
# with less CPU, once, but every kernel ran slower: a notebook's first
# output took about 2 s more CPU at 1 and 8 times as long at 0 (docs/tool-builds.md
# and docs/benchmarks.md: the numbers and the commands).

VENV_PYTHON="$REPO_ROOT/.venv/bin/python"
LIBTORCH_CONFIG="$REPO_ROOT/.cargo/libtorch.toml"
KERNEL_NAME="ddp-workbook"
KERNEL_DIR="$REPO_ROOT/.venv/share/jupyter/kernels/$KERNEL_NAME"
CARGO_BIN="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin"

say()  { printf '    %s\n' "$*"; }
done_already() { printf '    ok: %s\n' "$*"; }
fail() {
    printf '\nsetup_notebooks.sh: FAILED: %s\n' "$1" >&2
    shift
    for hint in "$@"; do printf '    -> %s\n' "$hint" >&2; done
    exit 1
}
section() { printf '\n==> notebooks: %s\n' "$*"; }

# The version `cargo install` recorded for evcxr_jupyter ("0.22.0"), or
# nothing. (evcxr_jupyter has no --version flag.)
installed_evcxr_version() {
    cargo install --list 2>/dev/null | sed -n -E 's/^evcxr_jupyter v([^:]+):$/\1/p'
}

step_evcxr() {
    local have
    have="$(installed_evcxr_version)"
    if [[ "$have" == "$EVCXR_VERSION" && -x "$CARGO_BIN/evcxr_jupyter" ]]; then
        done_already "evcxr_jupyter $have ($CARGO_BIN/evcxr_jupyter)"
        return
    fi
    local minor
    minor="$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')"
    [[ "$minor" =~ ^[0-9]+$ ]] && (( minor >= EVCXR_MIN_RUST_MINOR )) ||
        fail "evcxr_jupyter $EVCXR_VERSION needs Rust 1.$EVCXR_MIN_RUST_MINOR or newer; this is $(rustc --version)." \
             "Update it: rustup update stable, then run this script again."
    [[ -n "$have" ]] && say "found evcxr_jupyter $have; this project pins $EVCXR_VERSION: replacing it"
    say "installing evcxr_jupyter $EVCXR_VERSION with cargo install --locked"
    say "(compiles it from source, once: the longest step of set-up on a bare machine)"
    cargo install evcxr_jupyter --version "$EVCXR_VERSION" --locked ||
        fail "cargo install evcxr_jupyter --version $EVCXR_VERSION --locked failed (see above)." \
             "It needs a C compiler and linker: sudo apt-get install build-essential"
    done_already "evcxr_jupyter $EVCXR_VERSION installed in $CARGO_BIN"
}

step_rust_src() {
    if ! command -v rustup >/dev/null 2>&1; then
        # Rust from a distribution package: rust-src must come from there too.
        [[ -d "$(rustc --print sysroot)/lib/rustlib/src/rust/library" ]] ||
            fail "the Rust standard library's source (rust-src) is missing, and there is no rustup to add it." \
                 "Install Rust with rustup (https://rustup.rs), or your distribution's rust-src package."
        done_already "rust-src is in $(rustc --print sysroot)"
        return
    fi
    if rustup component list --installed 2>/dev/null | grep -q '^rust-src'; then
        done_already "rustup component rust-src"
        return
    fi
    say "rustup component add rust-src (evcxr infers variable types with it)"
    rustup component add rust-src || fail "rustup component add rust-src failed (see above)."
    done_already "rust-src added"
}

step_jupyter() {
    [[ -x "$VENV_PYTHON" ]] ||
        fail ".venv does not exist yet." "Run scripts/setup.sh (it makes .venv, then calls this script)."
    # Which pins are not installed at exactly their version?
    local missing
    missing="$("$VENV_PYTHON" - "${JUPYTER_PACKAGES[@]}" <<'EOF'
import importlib.metadata as metadata, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        if metadata.version(name) == version:
            continue
    except metadata.PackageNotFoundError:
        pass
    print(pin)
EOF
)"
    if [[ -z "$missing" ]]; then
        done_already "${JUPYTER_PACKAGES[*]} in .venv"
        return
    fi
    say "installing into .venv: ${JUPYTER_PACKAGES[*]}"
    "$VENV_PYTHON" -m pip install --no-input --progress-bar=off "${JUPYTER_PACKAGES[@]}" ||
        fail "pip could not install ${JUPYTER_PACKAGES[*]} (see pip's message above)."
    done_already "${JUPYTER_PACKAGES[*]} installed"
}

# LIBTORCH from .cargo/libtorch.toml, the file scripts/setup.sh writes.
libtorch_dir() {
    "$VENV_PYTHON" - "$LIBTORCH_CONFIG" <<'EOF'
import json, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
try:
    import tomllib  # Python 3.11 and newer
    print(tomllib.loads(text)["env"]["LIBTORCH"]["value"])
except ImportError:
    # setup.sh writes the value with json.dumps, a valid TOML basic string.
    print(json.loads(re.search(r'LIBTORCH\s*=\s*\{\s*value\s*=\s*("(?:[^"\\]|\\.)*")', text).group(1)))
EOF
}

# This checkout's name in the kernel's cache: "main-1a2b3c4d5e6f", the
# folder's name (to read) and a hash of its full path (to keep two
# checkouts called main apart).
checkout_key() {
    local name hash
    name="$(basename "$REPO_ROOT" | tr -c 'A-Za-z0-9._\n-' '_')"
    hash="$(printf '%s' "$REPO_ROOT" | sha256sum | cut -c1-12)"
    printf '%s-%s\n' "$name" "$hash"
}

step_kernel() {
    # The launcher gives each running kernel a build folder of its own with flock.
    command -v flock >/dev/null 2>&1 ||
        fail "flock was not found (the kernel's launcher needs it)." "Debian/Ubuntu: sudo apt-get install util-linux"
    [[ -f "$LIBTORCH_CONFIG" ]] ||
        fail ".cargo/libtorch.toml is missing, so the kernel would not know where libtorch is." \
             "Run scripts/setup.sh first (it writes that file, then calls this script)."
    local libtorch
    libtorch="$(libtorch_dir)" || fail "could not read LIBTORCH from .cargo/libtorch.toml." \
                                       "Run scripts/setup.sh again to rewrite it."
    [[ -f "$libtorch/lib/libtorch_cpu.so" ]] ||
        fail "LIBTORCH in .cargo/libtorch.toml ($libtorch) holds no lib/libtorch_cpu.so." \
             "Run scripts/setup.sh again."
    mkdir -p "$KERNEL_DIR"
    # The launcher's cache folder: this checkout's own (see the launcher).
    local CHECKOUT_KEY
    CHECKOUT_KEY="$(checkout_key)"
    # The launcher: the environment libtorch needs, a build folder of its
    # own, then evcxr_jupyter. Written fresh every time (it holds paths).
    cat >"$KERNEL_DIR/launch.sh.tmp" <<EOF
#!/usr/bin/env bash
# Written by scripts/setup_notebooks.sh (run it again if the checkout moves).
# Jupyter runs this to start the "Rust (ddp-workbook)" kernel for a notebook.
set -euo pipefail
export PATH=$(printf '%q' "$CARGO_BIN")":\$PATH"
# Where torch-sys finds libtorch while evcxr compiles the crate.
export LIBTORCH=$(printf '%q' "$libtorch")
# Where the compiled cells find their shared libraries when they run:
# libtorch's, and Rust's own libstd (evcxr links cells with -Cprefer-dynamic;
# the relative rpath rustc writes for it points to the wrong folder when the
# build folder and ~/.rustup share a parent, as they do under \$HOME).
rust_std_lib="\$(rustc --print sysroot)/lib/rustlib/\$(rustc -vV | sed -n 's/^host: //p')/lib"
export LD_LIBRARY_PATH="\$LIBTORCH/lib:\$rust_std_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
# evcxr's build folder, kept between kernels so that tch and libtorch's
# bindings are compiled once, outside the repository. Each running kernel
# takes a folder of its own (build-0, build-1, ...): two kernels writing
# the same folder would break each other's builds. A lock file marks a
# folder as taken; the lock is held as long as the kernel runs.
# One folder per checkout (its name and a hash of its path): the seed and
# build folders hold this checkout's crate and libtorch, so another
# checkout's set-up must not rewrite them.
cache="\${DDP_WORKBOOK_EVCXR_CACHE:-\${XDG_CACHE_HOME:-\$HOME/.cache}/ddp-workbook/evcxr/$CHECKOUT_KEY}"
mkdir -p "\$cache"
cache="\$(realpath "\$cache")"
# evcxr's build folders are cargo packages of their own. Under a folder whose
# Cargo.toml declares a workspace (this checkout's, when
# DDP_WORKBOOK_EVCXR_CACHE points inside it), cargo takes them for members
# the workspace does not list, and every cell fails with "Failed to load the
# project at .../build-0/Cargo.toml". Refuse such a folder here, saying why.
dir="\$cache"
while [[ "\$dir" != / ]]; do
    dir="\$(dirname "\$dir")"
    if [[ -f "\$dir/Cargo.toml" ]] && grep -q '^\[workspace\]' "\$dir/Cargo.toml"; then
        echo "ddp-workbook kernel: the notebooks' build folder \$cache is inside the cargo workspace of \$dir/Cargo.toml, where cargo would fail every cell with \"Failed to load the project at \$cache/build-0/Cargo.toml\". Set DDP_WORKBOOK_EVCXR_CACHE to a folder outside it, or unset it for the default, ~/.cache/ddp-workbook/evcxr." >&2
        exit 1
    fi
done
printf '%s\n' $(printf '%q' "$REPO_ROOT") >"\$cache/checkout"
# What a build made here depends on: a folder built with another libtorch,
# compiler or evcxr rebuilds everything.
stamp="libtorch=\$LIBTORCH \$(rustc -V) evcxr_jupyter=$EVCXR_VERSION"
if [[ "\${1:-}" == --print-seed ]]; then
    # For scripts/notebook_kernel.py prebuild: where the prebuilt folder is, and its stamp.
    printf '%s\n%s\n' "\$cache/seed" "\$stamp"
    exit 0
fi
if [[ -n "\${DDP_WORKBOOK_EVCXR_PREBUILD:-}" ]]; then
    # scripts/notebook_kernel.py prebuild (setup's last step): this kernel
    # builds the crate into the seed folder, which every new build folder
    # starts as a copy of, so that a learner's first kernel compiles nothing.
    exec 9>"\$cache/seed.lock"
    # Waits for kernels copying the seed (seconds) or another prebuild (minutes).
    flock --timeout 900 9 || { echo "ddp-workbook kernel: \$cache/seed.lock was held for 15 minutes: is another prebuild stuck?" >&2; exit 1; }
    mkdir -p "\$cache/seed"
    cp $(printf '%q' "$REPO_ROOT/Cargo.lock") "\$cache/seed/Cargo.lock"
    export EVCXR_TMPDIR="\$cache/seed"
    exec $(printf '%q' "$CARGO_BIN/evcxr_jupyter") --control_file "\$1"
fi
# A build folder not yet made with this stamp starts as a copy of the seed
# (430 MiB in docs/setup-sizes.md, a second or two) when the seed carries the stamp; the
# shared lock keeps a prebuild from rewriting the seed while it is copied.
seed_into() {
    local dir="\$1"
    [[ -f "\$cache/seed/ready" && "\$(cat "\$cache/seed/ready")" == "\$stamp" ]] || return 0
    [[ -f "\$dir/seed-stamp" && "\$(cat "\$dir/seed-stamp")" == "\$stamp" ]] && return 0
    exec 8>>"\$cache/seed.lock"
    if flock --shared --nonblock 8 && [[ "\$(cat "\$cache/seed/ready" 2>/dev/null)" == "\$stamp" ]]; then
        rm -rf "\$dir/target" "\$dir/target.copying"
        if cp -a "\$cache/seed/target" "\$dir/target.copying" && mv "\$dir/target.copying" "\$dir/target"; then
            printf '%s\n' "\$stamp" >"\$dir/seed-stamp"
        else
            rm -rf "\$dir/target.copying"   # a full disk, say: this kernel builds from nothing
        fi
    fi
    exec 8>&-
}
for slot in 0 1 2 3 4 5 6 7; do
    exec 9>"\$cache/build-\$slot.lock"
    if flock --nonblock 9; then
        mkdir -p "\$cache/build-\$slot"
        seed_into "\$cache/build-\$slot"
        # Build with the versions this repository was tested with.
        cp $(printf '%q' "$REPO_ROOT/Cargo.lock") "\$cache/build-\$slot/Cargo.lock"
        export EVCXR_TMPDIR="\$cache/build-\$slot"
        exec $(printf '%q' "$CARGO_BIN/evcxr_jupyter") --control_file "\$1"
    fi
    exec 9>&-
done
echo "ddp-workbook kernel: all 8 build folders in \$cache are in use; shut down another notebook's kernel" >&2
exit 1
EOF
    chmod +x "$KERNEL_DIR/launch.sh.tmp"
    mv "$KERNEL_DIR/launch.sh.tmp" "$KERNEL_DIR/launch.sh"
    "$VENV_PYTHON" - "$KERNEL_DIR" "$libtorch" <<'EOF'
import json, os, sys
kernel_dir, libtorch = sys.argv[1], sys.argv[2]
spec = {
    "argv": ["/usr/bin/env", "bash", os.path.join(kernel_dir, "launch.sh"), "{connection_file}"],
    "display_name": "Rust (ddp-workbook)",
    "language": "rust",
    "interrupt_mode": "message",
    # Also set by launch.sh; here too so that `jupyter kernelspec list --json` shows it.
    "env": {"LIBTORCH": libtorch},
    "metadata": {"written_by": "scripts/setup_notebooks.sh"},
}
with open(os.path.join(kernel_dir, "kernel.json.tmp"), "w") as f:
    json.dump(spec, f, indent=2)
    f.write("\n")
os.replace(os.path.join(kernel_dir, "kernel.json.tmp"), os.path.join(kernel_dir, "kernel.json"))
EOF
    "$VENV_PYTHON" -m jupyter kernelspec list 2>/dev/null | grep -q "^ *$KERNEL_NAME " ||
        fail "Jupyter in .venv does not list the kernel $KERNEL_NAME written to $KERNEL_DIR."
    done_already "kernel \"Rust (ddp-workbook)\" in ${KERNEL_DIR#"$REPO_ROOT"/} (LIBTORCH=$libtorch)"
}

# Before each checkout had a cache folder of its own, all shared
# ~/.cache/ddp-workbook/evcxr/{seed,build-N}; remove those (about 500 MiB
# each) unless a running kernel holds one (its lock is taken).
remove_shared_cache_folders() {
    local root="${XDG_CACHE_HOME:-$HOME/.cache}/ddp-workbook/evcxr" dir
    for dir in "$root"/seed "$root"/build-[0-9]; do
        [[ -d "$dir" && -f "$dir.lock" ]] || continue
        if flock --nonblock "$dir.lock" rm -rf "$dir"; then
            rm -f "$dir.lock"
            say "removed $dir (the cache folders are now one per checkout)"
        fi
    done
}

# The cache folders of checkouts that are gone (their `checkout` file names
# a folder without this script: a deleted CI clone, say), about 1.5 GiB each,
# unless a kernel still holds one of their locks.
remove_folders_of_gone_checkouts() {
    local root="${XDG_CACHE_HOME:-$HOME/.cache}/ddp-workbook/evcxr" dir lock held
    for dir in "$root"/*/; do
        dir="${dir%/}"
        [[ -f "$dir/checkout" && ! -f "$(cat "$dir/checkout")/scripts/setup_notebooks.sh" ]] || continue
        held=""
        for lock in "$dir"/*.lock; do
            [[ -e "$lock" ]] && ! flock --nonblock "$lock" true && held=1
        done
        [[ -z "$held" ]] || continue
        say "removing $dir: its checkout, $(cat "$dir/checkout"), is gone"
        rm -rf "$dir"
    done
}

step_prebuild() {
    remove_shared_cache_folders
    remove_folders_of_gone_checkouts
    "$VENV_PYTHON" "$REPO_ROOT/scripts/notebook_kernel.py" prebuild ||
        fail "the notebook kernel could not build the crate (see above)." \
             "Run it again to see the error: .venv/bin/python scripts/notebook_kernel.py prebuild --force"
}

# Each section prints its time, as scripts/setup.sh's steps do.
timed() {
    local started=$SECONDS
    section "$1"
    "$2"
    printf '    notebooks: took %ds\n' $((SECONDS - started))
}
timed "evcxr_jupyter $EVCXR_VERSION (the Rust kernel)" step_evcxr
timed "rust-src (type inference between cells)" step_rust_src
timed "Jupyter in .venv" step_jupyter
timed "the kernel \"Rust (ddp-workbook)\"" step_kernel
timed "the kernel's crate, prebuilt (a notebook's first cell then compiles none of it)" step_prebuild
