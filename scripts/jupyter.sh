#!/usr/bin/env bash
# Opens JupyterLab on this workbook's notebooks, with
# the kernel "Rust (ddp-workbook)" that every notebook asks for.
# Run it from anywhere, after scripts/setup.sh:
#     scripts/jupyter.sh
#     scripts/jupyter.sh --no-browser --port 8890    # any JupyterLab options
# Then open notebooks/00-introduction.ipynb and run the cells in order.
# Stop it with Ctrl-C (twice). notebooks/README.md explains the set-up.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JUPYTER="$REPO_ROOT/.venv/bin/jupyter"
KERNEL_SPEC="$REPO_ROOT/.venv/share/jupyter/kernels/ddp-workbook/kernel.json"

if [[ ! -x "$JUPYTER" || ! -f "$KERNEL_SPEC" ]]; then
    echo "scripts/jupyter.sh: Jupyter or the ddp-workbook kernel is not installed in this checkout." >&2
    echo "    -> run scripts/setup.sh (it installs both, once)" >&2
    exit 1
fi

# Jupyter refuses to start as root unless told; in a container, root is
# often the only user there is.
as_root=()
if [[ "$(id -u)" == 0 ]]; then
    as_root=(--allow-root)
fi

# The root is the repository, so that a notebook's links to the book
# (../chapters/...) open; the browser starts in notebooks/.
exec "$JUPYTER" lab \
    --ServerApp.root_dir="$REPO_ROOT" \
    --LabApp.default_url=/lab/tree/notebooks \
    "${as_root[@]}" \
    "$@"
