#!/usr/bin/env python3
"""Runs the notebooks in notebooks/ as CI does.

    .venv/bin/python scripts/run_notebooks.py                 # run every notebook, 2 at a time
    .venv/bin/python scripts/run_notebooks.py --jobs 1        # one at a time
    .venv/bin/python scripts/run_notebooks.py notebooks/02-replicas.ipynb
    .venv/bin/python scripts/run_notebooks.py --check-clean   # committed form only
    .venv/bin/python scripts/run_notebooks.py --strip NOTEBOOK...  # drop outputs
    .venv/bin/python scripts/run_notebooks.py --table docs/notebooks.md  # run, then write the times

Running: each notebook is executed top to bottom in a fresh
"Rust (ddp-workbook)" kernel (scripts/setup_notebooks.sh registers it) whose
working folder is the notebook's folder, so that evcxr reads that folder's
evcxr.toml. A notebook fails when a cell reports an error (evcxr fails a cell
on a compile error, a `?` error, or, with notebooks/evcxr.toml's
`preserve_vars_on_panic = false`, a panic), and also when `panicked at`
appears on a cell's stderr: a panic that something caught (a thread's join)
leaves the cell green, and must not leave the notebook green; and when a
cell shows a stray `()`, the value evcxr displays for a last expression of
type () left without its `;`. --jobs N
(default 2) runs N notebooks at once, each in its own kernel and build
folder: a kernel spends most of its time in one thread (evcxr's type
inference, rustc on a small cell), so two share 2 cores well.

--table FILE: after the run, writes FILE, a Markdown table of each
notebook's code cells, wall time, first code cell (the `:dep` build) and
result, with the whole run's time and CPU, the machine, the date, the load
average before and after, and the command: the times the docs state come
from there (docs/notebooks.md).

--check-clean: committed notebooks carry no outputs and no execution counts
(clean diffs: the runner makes the outputs), use the ddp-workbook kernel,
open with a markdown cell, and depend on the crate by its relative path in
their first code cell. --strip brings a notebook to that form. Both live in
scripts/notebook_form.py.

The last line is `N passed, N failed`, alone on its line; the exit status is
non-zero when anything failed. Tested by scripts/test_run_notebooks.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from notebook_form import KERNEL_NAME, clean_problems, strip, text_of

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
# Seconds one cell may take. The first cell of a notebook builds the crate
# (and, the first time ever, tch and libtorch's bindings: several minutes).
DEFAULT_CELL_TIMEOUT = 1800
DEFAULT_JOBS = 2
PANIC_MARK = "panicked at"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def default_notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]-*.ipynb"))


def shorten(text: str, lines: int = 30) -> str:
    kept = text.rstrip("\n").splitlines()
    if len(kept) > lines:
        kept = kept[:lines] + [f"... ({len(kept) - lines} more lines)"]
    return "\n".join("      " + line for line in kept)


def without_the_cell_source(details: str) -> str:
    """nbclient's error repeats the whole cell between two rules of dashes
    before the error itself; the report names the cell already, and a long
    cell would push the error out of the shortened report."""
    parts = details.split(SOURCE_RULE)
    return parts[-1].strip() if len(parts) >= 3 else details


SOURCE_RULE = "-" * 18


# -------------------------------------------------------------------- run


@dataclass
class Outcome:
    path: Path
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    # (cell number, seconds) for every code cell that ran.
    cell_seconds: list[tuple[int, float]] = field(default_factory=list)


def check_kernel(kernel: str) -> str | None:
    """None when Jupyter and the kernel are installed, else what to do."""
    try:
        import nbclient  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        return f"nbclient is not installed in {sys.executable}; run scripts/setup.sh, then .venv/bin/python {__file__}"

    try:
        KernelSpecManager().get_kernel_spec(kernel)
    except NoSuchKernel:
        return f"the Jupyter kernel {kernel!r} is not registered in this Python environment; run scripts/setup.sh"
    return None


def run_notebook(path: Path, kernel: str, timeout: int, save_dir: Path | None) -> Outcome:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    outcome = Outcome(path)
    nb = nbformat.read(path, as_version=4)
    started: dict[int, float] = {}

    def on_cell_execute(cell, cell_index):
        started[cell_index] = time.monotonic()

    def on_cell_executed(cell, cell_index, execute_reply):
        outcome.cell_seconds.append((cell_index + 1, time.monotonic() - started[cell_index]))

    client = NotebookClient(
        nb,
        kernel_name=kernel,
        timeout=timeout,
        # No cell may fail, whatever its tags say.
        force_raise_errors=True,
        # The kernel's working folder: evcxr reads evcxr.toml from there, and
        # `:dep ddp-workbook = { path = ".." }` is relative to it.
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_execute=on_cell_execute,
        on_cell_executed=on_cell_executed,
    )
    start = time.monotonic()
    try:
        client.execute()
    except CellExecutionError as error:
        index = max(started) if started else None
        source = text_of(nb.cells[index].source) if index is not None else ""
        first_line = source.strip().splitlines()[0] if source.strip() else ""
        details = ANSI_ESCAPE.sub("", "\n".join([error.evalue or "", error.traceback or ""]).strip())
        details = without_the_cell_source(details)
        where = f"cell {index + 1} (`{first_line[:60]}`)" if index is not None else "a cell"
        outcome.problems.append(f"{where} failed: {error.ename}:\n{shorten(details)}")
    except CellTimeoutError:
        cell = max(started) + 1 if started else "?"
        outcome.problems.append(f"cell {cell} ran longer than {timeout} s (--timeout) and was stopped")
    except DeadKernelError as error:
        outcome.problems.append(f"the kernel died: {error}")
    except Exception as error:  # kernel start-up failures and the like
        outcome.problems.append(f"could not run the notebook: {type(error).__name__}: {error}")
    outcome.seconds = time.monotonic() - start

    outcome.problems.extend(output_problems(nb))
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save_dir / path.name)
    return outcome


def output_problems(nb) -> list[str]:
    """What an executed notebook's outputs show that its cells' errors do
    not: a panic that something caught (`panicked at` on stderr), and a
    stray `()`, which evcxr shows when a cell ends in an expression of type
    `()` without a `;` (a `for` loop, an `if`, a block, a `match`)."""
    problems = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        outputs = cell.get("outputs", [])
        # The kernel sends stderr in pieces (often a line each): join them.
        stderr = "".join(
            text_of(output.get("text"))
            for output in outputs
            if output.get("output_type") == "stream" and output.get("name") == "stderr"
        )
        if PANIC_MARK in stderr:
            panic_onwards = stderr[stderr.rfind("\n", 0, stderr.index(PANIC_MARK)) + 1 :]
            problems.append(
                f"cell {index + 1} printed `{PANIC_MARK}` on stderr: something panicked, even if the "
                f"cell went on:\n{shorten(ANSI_ESCAPE.sub('', panic_onwards), 12)}"
            )
        shown = [
            text_of(output.get("data", {}).get("text/plain")).strip()
            for output in outputs
            if output.get("output_type") == "execute_result"
        ]
        if "()" in shown:
            problems.append(
                f"cell {index + 1} shows a stray `()`: it ends in an expression of type () (a `for` loop, "
                f"an `if`, a block, a `match`) that evcxr displays; end that last statement with `;`"
            )
    return problems


REPORT_LOCK = threading.Lock()  # one notebook's lines together, when several run at once


def report_run(outcome: Outcome) -> None:
    status = "FAIL" if outcome.problems else "ok  "
    code_cells = len(outcome.cell_seconds)
    first = f"{outcome.cell_seconds[0][1]:.1f} s" if outcome.cell_seconds else "-"
    slowest = sorted(outcome.cell_seconds[1:], key=lambda c: -c[1])[:3]
    slow = ", ".join(f"cell {n} {s:.1f} s" for n, s in slowest)
    lines = [
        f"{status}  {outcome.path.name:<28} {outcome.seconds:7.1f} s  "
        f"({code_cells} code cells run; first (build) {first}; slowest after it: {slow or '-'})"
    ] + [f"    {problem}" for problem in outcome.problems]
    with REPORT_LOCK:
        print("\n".join(lines), flush=True)


# ------------------------------------------------------------------ table


def load_averages() -> str:
    """The 1, 5 and 15-minute load averages, space-separated."""
    try:
        return " ".join(f"{load:.2f}" for load in os.getloadavg())
    except OSError:
        return "unknown"


def machine_line() -> str:
    """Cores, CPU model and kernel, as the benchmarks' tables write them."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}"


def code_cell_count(path: Path) -> int | str:
    """The notebook's code cells, counted in the file (a failed run stops early)."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return "?"
    return sum(cell.get("cell_type") == "code" for cell in cells)


def write_table(
    path: Path,
    outcomes: list[Outcome],
    *,
    command: str,
    kernel: str,
    jobs: int,
    started_utc: str,
    load_before: str,
    load_after: str,
    wall: float,
    cpu: float,
) -> None:
    """FILE for --table: a row per notebook, then how it was measured."""
    rows = [
        "| notebook | code cells | wall time | first code cell (the `:dep` build) | result |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for outcome in outcomes:
        first = f"{outcome.cell_seconds[0][1]:.1f} s" if outcome.cell_seconds else "-"
        result = "fail" if outcome.problems else "ok"
        rows.append(
            f"| `{outcome.path.name}` | {code_cell_count(outcome.path)} | {outcome.seconds:.1f} s | {first} | {result} |"
        )
    at_once = "one at a time" if jobs == 1 else f"{jobs} at a time, so that others ran beside each"
    caption = [
        f"- each notebook top to bottom in a fresh {kernel!r} kernel, {at_once}; its wall time runs from its"
        " kernel's start to the end of its last cell",
        f"- the whole run, {len(outcomes)} notebooks: {wall:.1f} s; {cpu:.1f} s of CPU in the kernels and what"
        f" they ran ({cpu / wall if wall else 0:.2f} cores busy)",
        f"- machine: {machine_line()}; {started_utc}",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
        f"- command: `{command}`",
    ]
    text = (
        f"<!-- Written by `{command}`; run it again to refresh, do not edit by hand. -->\n\n"
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(caption)
        + "\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def command_line(argv: list[str]) -> str:
    """This run as one would type it again from the repository root."""

    def from_root(name: str) -> str:
        try:
            return str(Path(name).absolute().relative_to(REPO_ROOT))
        except ValueError:
            return name

    return shlex.join([from_root(sys.executable), from_root(__file__), *argv])


# ------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/NN-*.ipynb")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check-clean", action="store_true", help="only check the committed form; run nothing")
    mode.add_argument("--strip", action="store_true", help="remove outputs and execution counts, in place")
    parser.add_argument("--kernel", default=KERNEL_NAME, help=f"kernel to run them in (default {KERNEL_NAME})")
    parser.add_argument(
        "--timeout", type=int, default=DEFAULT_CELL_TIMEOUT, help=f"seconds per cell (default {DEFAULT_CELL_TIMEOUT})"
    )
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help=f"notebooks run at once, each in its own kernel (default {DEFAULT_JOBS})"
    )
    parser.add_argument("--save-executed", type=Path, metavar="DIR", help="write the executed notebooks there")
    parser.add_argument(
        "--table", type=Path, metavar="FILE", help="after the run, write each notebook's time to FILE (Markdown)"
    )
    args = parser.parse_args(argv)
    if args.table and (args.check_clean or args.strip):
        parser.error("--table writes the times of a run; --check-clean and --strip run nothing")

    notebooks = args.notebooks or default_notebooks()
    missing = [p for p in notebooks if not p.is_file()]
    if not notebooks or missing:
        what = ", ".join(map(str, missing)) if missing else f"no NN-*.ipynb in {NOTEBOOK_DIR}"
        print(f"run_notebooks: nothing to run: {what}")
        print("0 passed, 1 failed")
        return 1

    if args.strip:
        for path in notebooks:
            strip(path)
            print(f"stripped {path}")
        return 0

    passed = failed = 0
    if args.check_clean:
        for path in notebooks:
            problems = clean_problems(path)
            print(f"{'FAIL' if problems else 'ok  '}  {path}")
            for problem in problems:
                print(f"    {problem}")
            passed, failed = passed + (not problems), failed + bool(problems)
    else:
        problem = check_kernel(args.kernel)
        if problem:
            print(f"run_notebooks: {problem}")
            print(f"0 passed, {len(notebooks)} failed")
            return 1
        jobs = max(1, min(args.jobs, len(notebooks)))
        print(f"running {len(notebooks)} notebook(s) in kernel {args.kernel!r}, {jobs} at a time", flush=True)
        load_before = load_averages()
        started_utc = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        total_start = time.monotonic()
        outcomes = []

        def run_and_report(path: Path) -> Outcome:
            outcome = run_notebook(path, args.kernel, args.timeout, args.save_executed)
            report_run(outcome)
            return outcome

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for outcome in pool.map(run_and_report, notebooks):
                passed, failed = passed + (not outcome.problems), failed + bool(outcome.problems)
                outcomes.append(outcome)
        # CPU time of the kernels and of all they ran (cargo, rustc): over the
        # wall time, how many cores the run kept busy (why --jobs 2 pays).
        wall = time.monotonic() - total_start
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = children.ru_utime + children.ru_stime
        print(f"all notebooks: {wall:.1f} s; {cpu:.1f} s of CPU in the kernels and what they ran ({cpu / wall:.2f} cores)")
        if args.table:
            write_table(
                args.table,
                outcomes,
                command=command_line(sys.argv[1:] if argv is None else argv),
                kernel=args.kernel,
                jobs=jobs,
                started_utc=started_utc,
                load_before=load_before,
                load_after=load_averages(),
                wall=wall,
                cpu=cpu,
            )
            print(f"wrote {args.table}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
