"""The form a committed notebook must have, for
scripts/run_notebooks.py: no outputs, no execution counts or timings (clean
diffs: the runner makes the outputs), the ddp-workbook kernel, a markdown
cell first, and the crate by its relative path in the first code cell.
`clean_problems` says what breaks that form, `strip` brings a notebook to it.
Not run on its own:

    .venv/bin/python scripts/run_notebooks.py --check-clean
    .venv/bin/python scripts/run_notebooks.py --strip NOTEBOOK...

Tested by scripts/test_run_notebooks.py.
"""

from __future__ import annotations

import json
from pathlib import Path

KERNEL_NAME = "ddp-workbook"
DEP_LINE = ':dep ddp-workbook = { path = ".." }'


def text_of(value) -> str:
    """A notebook stores text as one string or as a list of lines."""
    return "".join(value) if isinstance(value, list) else (value or "")


def clean_problems(path: Path) -> list[str]:
    """What keeps a committed notebook from being in its clean form."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"cannot be read as JSON: {error}"]
    problems = []
    if nb.get("nbformat") != 4:
        problems.append(f"nbformat is {nb.get('nbformat')!r}; write nbformat 4")
    kernel = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    if kernel != KERNEL_NAME:
        problems.append(f"metadata.kernelspec.name is {kernel!r}; it must be {KERNEL_NAME!r} (the project's kernel)")
    cells = nb.get("cells", [])
    if not cells or cells[0].get("cell_type") != "markdown":
        problems.append("the first cell must be markdown: what the chapter is about")
    code = [(i, c) for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    if not code or DEP_LINE not in text_of(code[0][1].get("source")):
        problems.append(f"the first code cell must hold `{DEP_LINE}` (the crate, by its relative path)")
    for i, cell in code:
        where = f"cell {i + 1}"
        if cell.get("outputs"):
            problems.append(f"{where} has outputs; committed notebooks have none (--strip removes them)")
        if cell.get("execution_count") is not None:
            problems.append(f"{where} has execution_count {cell['execution_count']}; it must be null (--strip)")
        if "execution" in cell.get("metadata", {}):
            problems.append(f"{where} has execution timings in its metadata (--strip removes them)")
    return problems


def strip(path: Path) -> None:
    """Removes outputs, execution counts and timings, in place."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
