#!/usr/bin/env python3
"""Proves that the browser check (scripts/check_book_in_browser.py) reports
each problem planted in the fixture book scripts/testdata/browser_book/, by
name, and nothing else there: the image that renders, the good anchors, the
console.log and the clean page other.html pass.

Planted, one element or page each: a page that does not load (moved.html,
a redirect to a page that is not there), an image that does not render, a
broken link, a broken #anchor, a script error, a console.error, and a
request to another address (a stylesheet from another host).

Run: .venv/bin/python scripts/test_check_book_in_browser.py
(the suite's `browser` check runs it before it checks the real book).
"""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
FIXTURE = SCRIPTS / "testdata" / "browser_book"

# Every line the check must print, by its start: each planted problem once.
PLANTED = [
    "PROBLEM moved.html: does not load: HTTP 404 for renamed.html",
    "PROBLEM index.html: image does not render: figures/missing.svg",
    # The same broken image, as the request that got no file.
    "PROBLEM index.html: failed to load: figures/missing.svg (HTTP 404)",
    # A script that is not there: reported once, though Chromium also cancels it.
    "PROBLEM index.html: failed to load: missing.js (HTTP 404)",
    "PROBLEM index.html: broken link: nowhere.html",
    "PROBLEM index.html: broken anchor: other.html#gone",
    "PROBLEM index.html: script error: Uncaught ReferenceError: notDefinedAnywhere is not defined",
    'PROBLEM index.html: console error: "planted: a console error"',
    "PROBLEM index.html: request to another address: https://fonts.example.com/reader.css",
]


def main():
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "check_book_in_browser.py"), "--book", str(FIXTURE)],
        capture_output=True, text=True, timeout=300,
    )
    lines = run.stdout.splitlines()
    reported = [line for line in lines if line.startswith("PROBLEM")]
    failures = []
    if run.returncode != 1:
        failures.append(f"exit status {run.returncode}, expected 1 (problems found)")
    for planted in PLANTED:
        count = sum(line.startswith(planted) for line in reported)
        if count != 1:
            failures.append(f"reported {count} times, expected once: {planted}")
    for line in reported:
        if not any(line.startswith(planted) for planted in PLANTED):
            failures.append(f"a problem that was not planted: {line}")
    if "external link (listed, not fetched): https://example.org/" not in lines:
        failures.append("the external link was not listed")
    if failures:
        print(run.stdout + run.stderr)
        for failure in failures:
            print(f"FAIL {failure}")
        sys.exit(1)
    print(f"the browser check reported each of the {len(PLANTED)} planted problems once, and nothing else: {lines[-1]}")


if __name__ == "__main__":
    main()
