#!/usr/bin/env python3
"""scripts/test_check_book_in_browser.py: proves that the browser check
(scripts/check_book_in_browser.py) fails on each problem planted in the
fixture book scripts/testdata/browser_book/ (a broken image, a broken
anchor, a broken link, a script error) and on nothing else there: the
image that renders, the good anchors and the clean page pass.

Run: .venv/bin/python scripts/test_check_book_in_browser.py
(the suite's `browser` check runs it before it checks the real book).
"""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
FIXTURE = SCRIPTS / "testdata" / "browser_book"

# Each planted problem, as the start of the line the check must print.
PLANTED = [
    "PROBLEM index.html: image does not render: figures/missing.svg",
    "PROBLEM index.html: broken anchor: other.html#gone",
    "PROBLEM index.html: broken link: nowhere.html",
    "PROBLEM index.html: script error: ReferenceError: notDefinedAnywhere",
]


def main():
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "check_book_in_browser.py"), "--book", str(FIXTURE)],
        capture_output=True, text=True, timeout=300,
    )
    lines = run.stdout.splitlines()
    failures = []
    if run.returncode != 1:
        failures.append(f"exit status {run.returncode}, expected 1 (problems found)")
    for planted in PLANTED:
        if not any(line.startswith(planted) for line in lines):
            failures.append(f"the planted problem was not reported: {planted}")
    # The missing image also shows as a failed request; nothing else may fail.
    expected = ("missing.svg", "other.html#gone", "nowhere.html", "notDefinedAnywhere")
    for line in lines:
        if line.startswith("PROBLEM") and not any(word in line for word in expected):
            failures.append(f"a problem that was not planted: {line}")
    if "external link (listed, not fetched): https://example.org/" not in lines:
        failures.append("the external link was not listed")
    if failures:
        print(run.stdout + run.stderr)
        for failure in failures:
            print(f"FAIL {failure}")
        sys.exit(1)
    print(f"the browser check found all {len(PLANTED)} planted problems and nothing else: {lines[-1]}")


if __name__ == "__main__":
    main()
