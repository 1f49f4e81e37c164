#!/usr/bin/env python3
"""The notebook kernel's prebuilt crate, and how
long a learner waits for a notebook's first output.

    .venv/bin/python scripts/notebook_kernel.py prebuild [--force]
    .venv/bin/python scripts/notebook_kernel.py first-output notebooks/00-introduction.ipynb [--json]

prebuild (the last step of scripts/setup_notebooks.sh): starts one
"Rust (ddp-workbook)" kernel whose launcher builds into the seed folder
(`~/.cache/ddp-workbook/evcxr/CHECKOUT/seed`, one per checkout, so that
another checkout's set-up leaves it alone), runs every distinct `:dep` cell of
notebooks/ there (the crate, then plotters for chapter 8), and marks the
seed ready with the launcher's stamp (libtorch, rustc and evcxr versions).
The launcher starts every new build folder as a copy of a ready seed, so a
learner's first kernel compiles none of tch or libtorch's bindings. Skipped
when the seed is ready with the current stamp (--force rebuilds it).

first-output: starts a fresh kernel as Jupyter does and runs a notebook's
code cells until one prints; prints the time from the kernel's start to
that output, and its parts (kernel start, each cell). `--cache DIR` runs the
kernel with DDP_WORKBOOK_EVCXR_CACHE=DIR (a scratch build-folder root);
`--json` adds one line `first-output-json: {...}` for `cargo xtask waits`.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The names for the kernel and the crate's `:dep` line, and the runner's notebooks.
from notebook_form import DEP_LINE, KERNEL_NAME, text_of
from run_notebooks import NOTEBOOK_DIR, default_notebooks

# A cell that needs the crate and prints: proves the prebuilt crate loads.
CHECK_CELL = 'println!("prebuilt: {}", ddp_workbook::tch::Tensor::from(2.0f64).double_value(&[]));'
CHECK_OUTPUT = "prebuilt: 2"
CELL_TIMEOUT = 1800  # a build of tch and libtorch's bindings from nothing takes minutes


def code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [text_of(cell["source"]) for cell in cells if cell["cell_type"] == "code"]


def dep_cells() -> list[str]:
    """Every distinct `:dep` cell of the notebooks, the crate's first."""
    found = [DEP_LINE]
    for notebook in default_notebooks():
        for source in code_cells(notebook):
            if source.strip().startswith(":dep") and source.strip() not in found:
                found.append(source.strip())
    return found


class Kernel:
    """One "Rust (ddp-workbook)" kernel, started in notebooks/ as Jupyter
    starts it (through its launcher), that runs cells one at a time."""

    def __init__(self, env: dict[str, str]):
        from jupyter_client.manager import KernelManager

        started = time.monotonic()
        self.manager = KernelManager(kernel_name=KERNEL_NAME)
        self.manager.start_kernel(cwd=str(NOTEBOOK_DIR), env={**os.environ, **env})
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.start_seconds = time.monotonic() - started

    def run(self, source: str) -> tuple[float, str]:
        """Runs one cell: (seconds, what it printed); raises on an error."""
        started = time.monotonic()
        msg_id = self.client.execute(source)
        printed, error = [], None
        while True:
            message = self.client.get_iopub_msg(timeout=CELL_TIMEOUT)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and content["name"] == "stdout":
                printed.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                printed.append(str(content["data"].get("text/plain", "")))
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if error:
            raise RuntimeError(f"the cell `{source.strip().splitlines()[0][:60]}` failed: {error}")
        return time.monotonic() - started, "".join(printed)

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


def seed_of_launcher() -> tuple[Path, str]:
    """The seed folder and the stamp, as the kernel's launcher computes them."""
    from jupyter_client.kernelspec import KernelSpecManager

    launcher = Path(KernelSpecManager().get_kernel_spec(KERNEL_NAME).resource_dir) / "launch.sh"
    lines = subprocess.run(["bash", str(launcher), "--print-seed"], capture_output=True, text=True, check=True)
    seed, stamp = lines.stdout.splitlines()[:2]
    return Path(seed), stamp


def start_from_another_seed(seed: Path) -> None:
    """A checkout's first prebuild starts from a copy of the newest ready
    seed of another checkout on this machine, when there is one: cargo then
    rebuilds only what differs (the crate, tch), as when all checkouts
    shared one seed, instead of tch and libtorch's bindings from nothing
    (a fresh CI clone: about 50 s instead of minutes)."""
    if (seed / "target").exists():
        return
    others = [
        s for s in seed.parent.parent.glob("*/seed") if s != seed and (s / "ready").is_file() and (s / "target").is_dir()
    ]
    if not others:
        return
    source = max(others, key=lambda s: (s / "ready").stat().st_mtime)
    with open(source.with_name("seed.lock"), "a") as lock:
        try:  # as the launcher copies: never while that checkout's prebuild rewrites it
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return
        seed.mkdir(parents=True, exist_ok=True)
        copying = seed / "target.copying"
        shutil.rmtree(copying, ignore_errors=True)
        if subprocess.run(["cp", "-a", str(source / "target"), str(copying)]).returncode == 0:
            copying.rename(seed / "target")
            print(f"    starting from a copy of {source}")
        else:
            shutil.rmtree(copying, ignore_errors=True)  # a full disk, say: build from nothing


def prebuild(force: bool) -> int:
    seed, stamp = seed_of_launcher()
    ready = seed / "ready"
    if not force and ready.is_file() and ready.read_text().strip() == stamp:
        print(f"    ok: the kernel's prebuilt crate in {seed} is ready ({stamp})")
        return 0
    ready.unlink(missing_ok=True)
    start_from_another_seed(seed)
    deps = dep_cells()
    print(f"    prebuilding the notebooks' crate in {seed}: {', '.join(d.split('=')[0].strip() for d in deps)}")
    print("    (tch and libtorch's bindings, compiled once: about 1.5 minutes on 2 cores)", flush=True)
    started = time.monotonic()
    kernel = Kernel({"DDP_WORKBOOK_EVCXR_PREBUILD": "1"})
    try:
        for source in deps:
            seconds, _ = kernel.run(source)
            print(f"    {source.split('=')[0].strip():<24} {seconds:6.1f} s", flush=True)
        _, printed = kernel.run(CHECK_CELL)
    finally:
        kernel.stop()
    if CHECK_OUTPUT not in printed:
        print(f"prebuild: the check cell printed {printed!r}, not {CHECK_OUTPUT!r}", file=sys.stderr)
        return 1
    ready.write_text(stamp + "\n")
    print(f"    ok: prebuilt in {time.monotonic() - started:.0f} s; new build folders start as copies of {seed}")
    return 0


def first_output(notebook: Path, cache: Path | None, as_json: bool) -> int:
    env = {"DDP_WORKBOOK_EVCXR_CACHE": str(cache.resolve())} if cache else {}
    kernel = Kernel(env)
    parts = [("kernel start", kernel.start_seconds)]
    try:
        for number, source in enumerate(code_cells(notebook), start=1):
            seconds, printed = kernel.run(source)
            parts.append((f"code cell {number} `{source.strip().splitlines()[0][:40]}`", seconds))
            if printed.strip():
                break
        else:
            print(f"first-output: no code cell of {notebook} printed anything", file=sys.stderr)
            return 1
    finally:
        kernel.stop()
    total = sum(seconds for _, seconds in parts)
    print(f"{notebook.name}: first output after {total:.1f} s")
    for what, seconds in parts:
        print(f"    {seconds:6.1f} s  {what}")
    if as_json:
        record = {"notebook": notebook.name, "seconds": total, "parts": [[w, s] for w, s in parts]}
        print("first-output-json: " + json.dumps(record))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("prebuild", help="build the kernel's crate once, into the seed folder")
    build.add_argument("--force", action="store_true", help="rebuild even when the seed is ready")
    first = commands.add_parser("first-output", help="time a fresh kernel until a notebook's first output")
    first.add_argument("notebook", type=Path)
    first.add_argument("--cache", type=Path, help="build-folder root for this kernel (DDP_WORKBOOK_EVCXR_CACHE)")
    first.add_argument("--json", action="store_true", help="also print one first-output-json: line")
    args = parser.parse_args(argv)
    try:
        if args.command == "prebuild":
            return prebuild(args.force)
        return first_output(args.notebook, args.cache, args.json)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
        print(f"notebook_kernel.py {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
