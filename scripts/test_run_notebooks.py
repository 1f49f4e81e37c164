#!/usr/bin/env python3
"""Tests of the notebook runner, scripts/run_notebooks.py.

    .venv/bin/python scripts/test_run_notebooks.py

The --check-clean and --strip tests need nothing but Python. The others run
the fixture notebooks of scripts/testdata/ in the "Rust (ddp-workbook)"
kernel (about a minute) and are skipped, saying why, when it is not
installed (scripts/setup.sh installs it):
- planted_panic.ipynb: a cell panics; the runner must fail the notebook at
  that cell, as a cell error, because notebooks/evcxr.toml (copied next to
  the fixture, as in notebooks/) sets preserve_vars_on_panic = false; and,
  without that file, still fail it through the `panicked at` on stderr;
- thread_panic.ipynb: a panic that the cell catches; only stderr shows it;
- passes.ipynb: nothing fails; the runner must pass it.
That run also writes --table; TableTest checks the table's form without a
kernel, by calling the runner's write_table on made-up outcomes.
OutputsTest checks what the runner reads in a run's outputs (a caught panic,
a stray `()`) on made-up outputs. LauncherTest runs the kernel's launcher, as scripts/setup_notebooks.sh
writes it, up to its choice of build folder (bash and rustc only).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import run_notebooks  # noqa: E402  (after the path it is found on)

RUNNER = SCRIPTS / "run_notebooks.py"
TESTDATA = SCRIPTS / "testdata"
EVCXR_TOML = SCRIPTS.parent / "notebooks" / "evcxr.toml"


def run_runner(*args: str, env: dict | None = None) -> tuple[int, str]:
    """Runs the runner as CI does; returns its exit status and its output."""
    done = subprocess.run(
        [sys.executable, str(RUNNER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=1800,
    )
    return done.returncode, done.stdout


def last_line(output: str) -> str:
    return output.rstrip("\n").splitlines()[-1]


def clean_notebook() -> dict:
    """A notebook in the committed form that --check-clean asks for."""
    return {
        "cells": [
            {"cell_type": "markdown", "id": "intro", "metadata": {}, "source": ["What the chapter is about."]},
            {
                "cell_type": "code",
                "id": "dep",
                "metadata": {},
                "source": [':dep ddp-workbook = { path = ".." }'],
                "execution_count": None,
                "outputs": [],
            },
            {
                "cell_type": "code",
                "id": "work",
                "metadata": {},
                "source": ["1 + 1"],
                "execution_count": None,
                "outputs": [],
            },
        ],
        "metadata": {"kernelspec": {"name": "ddp-workbook", "display_name": "Rust (ddp-workbook)", "language": "rust"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def kernel_missing() -> str | None:
    """Why the kernel tests cannot run here, or None."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
        import nbclient  # noqa: F401
    except ImportError:
        return "Jupyter is not installed in this Python; run with .venv/bin/python after scripts/setup.sh"
    try:
        KernelSpecManager().get_kernel_spec("ddp-workbook")
    except NoSuchKernel:
        return "the ddp-workbook kernel is not registered; run scripts/setup.sh"
    return None


class CheckCleanTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(tempfile.mkdtemp(prefix="run_notebooks_test_"))
        self.addCleanup(shutil.rmtree, self.folder)

    def write(self, name: str, notebook: dict) -> Path:
        path = self.folder / name
        path.write_text(json.dumps(notebook, indent=1), encoding="utf-8")
        return path

    def test_a_clean_notebook_passes(self):
        status, output = run_runner("--check-clean", str(self.write("00-clean.ipynb", clean_notebook())))
        self.assertEqual(status, 0, output)
        self.assertEqual(last_line(output), "1 passed, 0 failed")

    def test_outputs_counts_timings_and_a_foreign_kernel_are_each_reported(self):
        notebook = clean_notebook()
        work = notebook["cells"][2]
        work["outputs"] = [{"output_type": "execute_result", "data": {"text/plain": ["2"]}, "metadata": {}, "execution_count": 3}]
        work["execution_count"] = 3
        work["metadata"]["execution"] = {"shell.execute_reply": "2026-01-01T00:00:00Z"}
        notebook["metadata"]["kernelspec"]["name"] = "rust"
        status, output = run_runner("--check-clean", str(self.write("01-dirty.ipynb", notebook)))
        self.assertEqual(status, 1, output)
        for expected in ("cell 3 has outputs", "execution_count 3", "execution timings", "kernelspec.name is 'rust'"):
            self.assertIn(expected, output)
        self.assertEqual(last_line(output), "0 passed, 1 failed")

    def test_the_crate_dependency_and_the_opening_markdown_are_required(self):
        notebook = clean_notebook()
        notebook["cells"] = notebook["cells"][2:]  # no markdown, no :dep
        status, output = run_runner("--check-clean", str(self.write("02-bare.ipynb", notebook)))
        self.assertEqual(status, 1, output)
        self.assertIn("first cell must be markdown", output)
        self.assertIn(':dep ddp-workbook = { path = ".." }', output)

    def test_strip_brings_a_notebook_to_the_clean_form_and_changes_nothing_twice(self):
        notebook = clean_notebook()
        notebook["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["2\n"]}]
        notebook["cells"][2]["execution_count"] = 1
        path = self.write("03-strip.ipynb", notebook)
        self.assertEqual(run_runner("--check-clean", str(path))[0], 1)
        status, output = run_runner("--strip", str(path))
        self.assertEqual(status, 0, output)
        stripped = path.read_text(encoding="utf-8")
        status, output = run_runner("--check-clean", str(path))
        self.assertEqual(status, 0, output)
        run_runner("--strip", str(path))
        self.assertEqual(path.read_text(encoding="utf-8"), stripped)

    def test_a_missing_notebook_is_a_failure_not_a_silent_pass(self):
        status, output = run_runner("--check-clean", str(self.folder / "99-absent.ipynb"))
        self.assertEqual(status, 1, output)
        self.assertEqual(last_line(output), "0 passed, 1 failed")


TABLE_HEADER = "| notebook | code cells | wall time | first code cell (the `:dep` build) | result |"


class TableTest(unittest.TestCase):
    """--table's file: its columns, a row per notebook, how it was measured."""

    def setUp(self):
        self.folder = Path(tempfile.mkdtemp(prefix="run_notebooks_test_"))
        self.addCleanup(shutil.rmtree, self.folder)

    def test_the_table_has_a_row_per_notebook_under_the_expected_columns(self):
        notebooks = []
        for name in ("00-first.ipynb", "01-second.ipynb"):
            path = self.folder / name
            path.write_text(json.dumps(clean_notebook()), encoding="utf-8")
            notebooks.append(path)
        ok = run_notebooks.Outcome(notebooks[0], seconds=12.34, cell_seconds=[(2, 4.56), (3, 0.7)])
        failed = run_notebooks.Outcome(notebooks[1], seconds=3.0, problems=["cell 3 failed"], cell_seconds=[(2, 2.5)])
        table = self.folder / "out" / "notebooks.md"
        run_notebooks.write_table(
            table,
            [ok, failed],
            command=".venv/bin/python scripts/run_notebooks.py --table docs/notebooks.md",
            kernel="ddp-workbook",
            jobs=2,
            started_utc="2026-01-01 00:00 UTC",
            load_before="1.00 2.00 3.00",
            load_after="1.50 2.00 3.00",
            wall=15.0,
            cpu=21.0,
        )
        lines = table.read_text(encoding="utf-8").splitlines()
        self.assertTrue(lines[0].startswith("<!-- Written by `.venv/bin/python scripts/run_notebooks.py --table"), lines[0])
        start = lines.index(TABLE_HEADER)
        self.assertEqual(lines[start + 1], "| --- | ---: | ---: | ---: | --- |")
        # The code cells are counted in the file (2), not among the cells that ran.
        self.assertEqual(lines[start + 2], "| `00-first.ipynb` | 2 | 12.3 s | 4.6 s | ok |")
        self.assertEqual(lines[start + 3], "| `01-second.ipynb` | 2 | 3.0 s | 2.5 s | fail |")
        caption = "\n".join(lines[start + 4 :])
        for expected in (
            "2 at a time",
            "the whole run, 2 notebooks: 15.0 s; 21.0 s of CPU",
            "(1.40 cores busy)",
            "- machine: ",
            " cores (",
            "; 2026-01-01 00:00 UTC",
            "load average (1, 5, 15 min) before: 1.00 2.00 3.00; after: 1.50 2.00 3.00",
            "- command: `.venv/bin/python scripts/run_notebooks.py --table docs/notebooks.md`",
        ):
            self.assertIn(expected, caption)

    def test_table_with_check_clean_or_strip_is_refused(self):
        path = self.folder / "00-clean.ipynb"
        path.write_text(json.dumps(clean_notebook()), encoding="utf-8")
        for mode in ("--check-clean", "--strip"):
            status, output = run_runner(mode, "--table", str(self.folder / "t.md"), str(path))
            self.assertEqual(status, 2, output)
            self.assertIn("--table writes the times of a run", output)
        self.assertFalse((self.folder / "t.md").exists())


@unittest.skipIf(kernel_missing(), kernel_missing())
class RunTest(unittest.TestCase):
    """Runs the fixtures in the real kernel."""

    @classmethod
    def setUpClass(cls):
        # Beside the fixtures, the notebooks' own evcxr.toml, as in notebooks/.
        cls.folder = Path(tempfile.mkdtemp(prefix="run_notebooks_test_"))
        cls.saved = cls.folder / "executed"
        for fixture in ("planted_panic.ipynb", "thread_panic.ipynb", "passes.ipynb"):
            shutil.copy(TESTDATA / fixture, cls.folder / fixture)
        shutil.copy(EVCXR_TOML, cls.folder / "evcxr.toml")
        # No evcxr.toml from the user's own config folder either.
        cls.env = dict(os.environ, EVCXR_CONFIG_DIR=str(cls.folder / "no-user-config"))
        cls.table = cls.folder / "times.md"
        cls.status, cls.output = run_runner(
            "--save-executed",
            str(cls.saved),
            "--table",
            str(cls.table),
            *(str(cls.folder / f) for f in ("planted_panic.ipynb", "thread_panic.ipynb", "passes.ipynb")),
            env=cls.env,
        )

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.folder)

    def report_of(self, name: str) -> str:
        """The runner's lines about one notebook: its status line and its problems."""
        lines = self.output.splitlines()
        start = next(i for i, line in enumerate(lines) if name in line and line[:4] in ("ok  ", "FAIL"))
        end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
        return "\n".join(lines[start:end])

    def test_the_summary_counts_one_pass_and_two_failures_and_the_exit_status_says_so(self):
        self.assertEqual(last_line(self.output), "1 passed, 2 failed", self.output)
        # Two at a time by default (--jobs), each notebook's report whole: the other tests read them.
        self.assertIn("3 notebook(s) in kernel 'ddp-workbook', 2 at a time", self.output)
        self.assertEqual(self.status, 1, self.output)

    def test_a_panicking_cell_fails_the_notebook_as_a_cell_error_and_stops_it(self):
        report = self.report_of("planted_panic.ipynb")
        self.assertTrue(report.startswith("FAIL"), report)
        # A cell error, not only stderr: evcxr read evcxr.toml from the notebook's folder.
        self.assertIn("cell 3 (`panic!(", report)
        self.assertIn("failed:", report)
        self.assertIn("planted panic", report)
        self.assertNotIn("An error occurred while executing", report, "the report shows the error, not the cell again")
        executed = json.loads((self.saved / "planted_panic.ipynb").read_text(encoding="utf-8"))
        self.assertEqual(executed["cells"][3]["outputs"], [], "the cell after the panic must not run")

    def test_a_caught_panic_fails_the_notebook_through_stderr(self):
        report = self.report_of("thread_panic.ipynb")
        self.assertTrue(report.startswith("FAIL"), report)
        self.assertIn("cell 2 printed `panicked at` on stderr", report)
        self.assertIn("planted panic in a thread", report)

    def test_a_notebook_without_failures_passes(self):
        report = self.report_of("passes.ipynb")
        self.assertTrue(report.startswith("ok"), report)

    def test_the_table_names_each_notebook_and_its_result_in_the_order_given(self):
        lines = self.table.read_text(encoding="utf-8").splitlines()
        start = lines.index(TABLE_HEADER)
        rows = [line.split(" | ") for line in lines[start + 2 : start + 5]]
        self.assertEqual([row[0] for row in rows], ["| `planted_panic.ipynb`", "| `thread_panic.ipynb`", "| `passes.ipynb`"])
        self.assertEqual([row[-1] for row in rows], ["fail |", "fail |", "ok |"])
        self.assertIn("the whole run, 3 notebooks: ", "\n".join(lines))

    def test_without_evcxr_toml_a_panic_still_fails_the_notebook_through_stderr(self):
        bare = self.folder / "bare"
        bare.mkdir()
        shutil.copy(TESTDATA / "planted_panic.ipynb", bare / "planted_panic.ipynb")
        status, output = run_runner(str(bare / "planted_panic.ipynb"), env=self.env)
        self.assertEqual(status, 1, output)
        self.assertIn("printed `panicked at` on stderr", output)
        self.assertEqual(last_line(output), "0 passed, 1 failed")


class OutputsTest(unittest.TestCase):
    """What the runner reads in a notebook's outputs after a run, on made-up
    outputs in the form the kernel gives them (no kernel needed)."""

    @staticmethod
    def executed(*outputs: list) -> dict:
        cells = [{"cell_type": "markdown", "id": "intro", "metadata": {}, "source": "About."}]
        cells += [
            {"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": "", "outputs": out}
            for i, out in enumerate(outputs)
        ]
        return {"cells": cells}

    def test_a_stray_unit_value_and_a_caught_panic_are_problems_and_other_values_are_not(self):
        printed = {"output_type": "stream", "name": "stdout", "text": ["1\n", "2\n"]}
        unit = {"output_type": "execute_result", "data": {"text/plain": "()"}, "metadata": {}}
        value = {"output_type": "execute_result", "data": {"text/plain": "42"}, "metadata": {}}
        panic = {"output_type": "stream", "name": "stderr", "text": "thread 'x' panicked at src/lib.rs:1:1:\nboom\n"}
        problems = run_notebooks.output_problems(self.executed([printed, unit], [printed, value], [printed], [panic]))
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(problems[0].startswith("cell 2 shows a stray `()`"), problems)
        self.assertIn("end that last statement with `;`", problems[0])
        self.assertTrue(problems[1].startswith("cell 5 printed `panicked at`"), problems)


def kernel_launcher(folder: Path) -> Path:
    """The kernel's launcher as scripts/setup_notebooks.sh writes it, with
    made-up paths for libtorch and the checkout, written into `folder`."""
    setup = (SCRIPTS / "setup_notebooks.sh").read_text()
    start = setup.index('cat >"$KERNEL_DIR/launch.sh.tmp" <<EOF\n')
    body = setup[setup.index("\n", start) + 1 :]
    body = body[: body.index("\nEOF\n")]
    values = {
        "CARGO_BIN": str(folder / "bin"),
        "libtorch": str(folder / "libtorch"),
        "CHECKOUT_KEY": "checkout-0123456789ab",
        "EVCXR_VERSION": "0.22.0",
        "REPO_ROOT": str(folder / "checkout"),
    }
    assignments = "".join(f"{name}={shlex.quote(value)}\n" for name, value in values.items())
    rendered = subprocess.run(
        ["bash", "-c", f"{assignments}cat <<EOF\n{body}\nEOF\n"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    launcher = folder / "launch.sh"
    launcher.write_text(rendered)
    return launcher


class LauncherTest(unittest.TestCase):
    """The launcher refuses a build folder inside a cargo workspace (where
    cargo would fail every cell with "Failed to load the project at
    .../build-0/Cargo.toml"), saying what to do, and takes one outside.
    `--print-seed` stops it before it starts evcxr; needs only bash and rustc."""

    def setUp(self):
        self.folder = Path(tempfile.mkdtemp(prefix="launcher-test-"))
        self.addCleanup(shutil.rmtree, self.folder, ignore_errors=True)
        self.launcher = kernel_launcher(self.folder)
        (self.folder / "checkout").mkdir()
        (self.folder / "checkout" / "Cargo.toml").write_text('[package]\nname = "x"\n\n[workspace]\nmembers = ["."]\n')

    def launch(self, cache: Path) -> subprocess.CompletedProcess:
        env = dict(os.environ, DDP_WORKBOOK_EVCXR_CACHE=str(cache))
        return subprocess.run(
            ["bash", str(self.launcher), "--print-seed"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
        )

    def test_a_build_folder_inside_a_workspace_is_refused_with_what_to_do(self):
        done = self.launch(self.folder / "checkout" / "notebooks" / "cache")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("inside the cargo workspace of", done.stderr)
        self.assertIn("Failed to load the project", done.stderr)
        self.assertIn("Set DDP_WORKBOOK_EVCXR_CACHE to a folder outside it", done.stderr)

    def test_a_build_folder_outside_any_workspace_is_taken(self):
        cache = self.folder / "cache"
        done = self.launch(cache)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.splitlines()[0], str(cache.resolve() / "seed"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
