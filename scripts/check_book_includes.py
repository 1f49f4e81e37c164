#!/usr/bin/env python3
"""scripts/check_book_includes.py: fails when a page of the book includes code
that is not there.

Run: python3 scripts/check_book_includes.py [BOOK_ROOT]   (scripts/test.sh runs it)

Why: the book never pastes code, it includes it from the compiled files with
{{#include ../src/ch01_collectives/solution.rs:ring_all_reduce}}. mdBook only
logs a missing file and still exits 0, and a missing ANCHOR gives an empty
listing with no message at all. So a renamed anchor would quietly empty a
page. This script resolves every include the way mdBook does and reports each
one that points at a missing file, a missing `// ANCHOR: name`, an anchor
without its `// ANCHOR_END: name`, or lines that select nothing.

Standard library only: it runs with the system python3, before any set-up.
"""

import pathlib
import re
import sys

# The link syntax mdBook recognises (its `links` preprocessor); group 1 is
# the kind, group 2 the target and properties. A backslash escapes a link.
LINK = re.compile(r"\\\{\{#.*\}\}|\{\{\s*#([a-zA-Z0-9_]+)\s+([^}]+)\}\}")
ANCHOR_START = re.compile(r"ANCHOR:\s*([\w_-]+)")
ANCHOR_END = re.compile(r"ANCHOR_END:\s*([\w_-]+)")
FILE_KINDS = ("include", "rustdoc_include", "playground", "playpen")


def book_source_dir(root: pathlib.Path) -> pathlib.Path:
    """The `src` of book.toml's [book] table (mdBook's default is `src`)."""
    src = "src"
    try:
        import tomllib  # Python 3.11+

        config = tomllib.loads((root / "book.toml").read_text())
        src = config.get("book", {}).get("src", src)
    except ImportError:  # Python 3.10: a plain reading of `src = "..."`
        match = re.search(r'^\s*src\s*=\s*"([^"]+)"', (root / "book.toml").read_text(), re.M)
        if match:
            src = match.group(1)
    return root / src


def anchored_lines(text: str, anchor: str):
    """The lines between `ANCHOR: anchor` and `ANCHOR_END: anchor`, or an
    error message saying which marker is missing."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines)
              if (m := ANCHOR_START.search(line)) and m.group(1) == anchor
              and not ANCHOR_END.search(line)]
    if not starts:
        return None, f"no line `// ANCHOR: {anchor}` in the file"
    ends = [i for i, line in enumerate(lines)
            if (m := ANCHOR_END.search(line)) and m.group(1) == anchor and i > starts[0]]
    if not ends:
        return None, f"`// ANCHOR: {anchor}` has no `// ANCHOR_END: {anchor}` after it"
    body = [line for line in lines[starts[0] + 1:ends[0]]
            if not ANCHOR_START.search(line) and not ANCHOR_END.search(line)]
    return body, None


def selected_lines(text: str, selector: str):
    """Apply an include's `:anchor` or `:start:end` part as mdBook does."""
    lines = text.splitlines()
    if selector == "":
        return lines, None
    parts = selector.split(":", 2)
    first = parts[0]
    if first and not first.isdigit():
        return anchored_lines(text, first)
    start = int(first) - 1 if first else 0
    start = max(start, 0)
    if len(parts) == 1:          # `file:N` is the single line N
        end = start + 1
    elif parts[1].isdigit():     # `file:N:M`
        end = int(parts[1])
    else:                        # `file:N:` is line N to the end
        end = len(lines)
    return lines[start:end], None


def check_page(page: pathlib.Path, src_dir: pathlib.Path):
    """Yield one message per broken include on this page."""
    text = page.read_text(encoding="utf-8")
    for match in LINK.finditer(text):
        kind, target = match.group(1), match.group(2)
        if kind not in FILE_KINDS:
            continue  # an escaped link, or {{#title ...}}
        line_number = text.count("\n", 0, match.start()) + 1
        where = f"{page.relative_to(src_dir.parent)}:{line_number}: {match.group(0)}"
        path_part, _, selector = target.split()[0].partition(":")
        if kind in ("playground", "playpen"):
            selector = ""
        included = (page.parent / path_part).resolve()
        if not included.is_file():
            yield f"{where}\n      file not found: {included}"
            continue
        body, problem = selected_lines(included.read_text(encoding="utf-8"), selector)
        if problem:
            yield f"{where}\n      {problem} ({included})"
        elif not any(line.strip() for line in body):
            yield f"{where}\n      selects no code (empty anchor or line range) in {included}"


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    if not (root / "book.toml").is_file():
        print(f"check_book_includes: no book.toml in {root}")
        return 1
    src_dir = book_source_dir(root)
    pages = sorted(src_dir.rglob("*.md"))
    problems = [p for page in pages for p in check_page(page, src_dir)]
    includes = sum(1 for page in pages
                   for m in LINK.finditer(page.read_text(encoding="utf-8"))
                   if m.group(1) in FILE_KINDS)
    for problem in problems:
        print(f"  broken include: {problem}")
    print(f"check_book_includes: {len(pages)} pages, {includes} includes, "
          f"{len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
