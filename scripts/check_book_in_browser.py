#!/usr/bin/env python3
"""scripts/check_book_in_browser.py: opens every page of the rendered book in
headless Chromium and fails on what a reader would see broken.

Run (after `mdbook build`; the suite's `browser` check does both):
    .venv/bin/python scripts/check_book_in_browser.py
    .venv/bin/python scripts/check_book_in_browser.py --book book --screenshots docs/screenshots
Its own test: .venv/bin/python scripts/test_check_book_in_browser.py

Each page of --book is served by a loopback HTTP server (127.0.0.1, a free
port) and opened in Chromium from Debian's packages (`apt-get install
chromium`, which scripts/setup.sh does), driven through its DevTools
protocol over a pipe (`--remote-debugging-pipe`), so nothing beyond Python's
standard library is needed. A problem is:
  - a page that does not load;
  - an image that does not render (not complete, or naturalWidth == 0);
  - a link to a page or file of the book that does not exist, or to an
    #anchor that its page does not have;
  - a script error or console error (an exception, console.error, or a
    resource that failed to load), and any request for another address.
Links to other sites are listed, never fetched: Chromium resolves no host
name but 127.0.0.1. With --screenshots DIR it saves the pages of
--screenshot-pages in the light and the dark (navy) theme, each scrolled to
its first figure. The last line is `N pages, N problems`; the exit status
is 1 when there is a problem, 2 when the check itself could not run.
"""

import argparse
import base64
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from browser_devtools import DevTools, DevToolsError

THEMES = {"light": "light", "dark": "navy"}
PAGE_TIMEOUT = 30.0
# A browser asks for /favicon.ico by itself on a page that names no icon
# (mdBook's toc.html, for readers without JavaScript): not the book's link.
IMPLICIT_REQUESTS = ("/favicon.ico",)
# mdBook's page for a missing URL roots its links at the site's root
# (<base href="/">), so its heading's own anchor points at index.html when
# read as a file of the book: its links are not checked.
LINKS_NOT_CHECKED = ("404.html",)

# Runs in the page after its load event: what it shows and links to.
INSPECT_PAGE = """
(() => ({
  title: document.title,
  broken_images: [...document.images]
    .filter(img => !img.complete || img.naturalWidth === 0)
    .map(img => img.getAttribute('src')),
  images: document.images.length,
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id)
    .concat([...document.querySelectorAll('a[name]')].map(a => a.name)),
}))()
"""


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def quiet_server(book):
    """A loopback HTTP server for `book` that notes every path it had to 404."""
    missing = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(book), **kwargs)

        def send_error(self, code, message=None, explain=None):
            if code == 404:
                missing.append(urllib.parse.unquote(urllib.parse.urlsplit(self.path).path))
            super().send_error(code, message, explain)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, missing


def start_chromium(chromium, profile):
    """Chromium, headless, driven through fds 3 (commands in) and 4 (replies out)."""
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # Copies above 4, so that placing them on 3 and 4 never overwrites one.
    high_r, high_w = os.dup(to_browser_r), os.dup(from_browser_w)
    while min(high_r, high_w) <= 4:
        high_r, high_w = os.dup(high_r), os.dup(high_w)

    def place_pipes():
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    args = [
        chromium, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
        "--disable-gpu", "--no-first-run", "--no-default-browser-check",
        "--disable-extensions", "--disable-background-networking", "--disable-sync",
        "--disable-component-update", "--hide-scrollbars", "--mute-audio",
        # The network is closed, and the book must not need it: every host
        # name but the loopback server's fails at once.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--user-data-dir={profile}", "about:blank",
    ]
    # close_fds=False: Popen would close 3 and 4 after place_pipes; every
    # other descriptor of this process is close-on-exec anyway.
    process = subprocess.Popen(
        args, close_fds=False, preexec_fn=place_pipes,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for fd in (to_browser_r, from_browser_w, high_r, high_w):
        os.close(fd)
    return process, DevTools(to_browser_w, from_browser_r)


def local_target(url, origin, book):
    """For a link into the book: (file path in the book, fragment); else None."""
    parts = urllib.parse.urlsplit(url)
    if f"{parts.scheme}://{parts.netloc}" != origin:
        return None
    path = urllib.parse.unquote(parts.path).lstrip("/")
    target = book / path
    if not path or target.is_dir():
        target = target / "index.html"
    return target, urllib.parse.unquote(parts.fragment)


def open_page(tools, session, url):
    """Navigates to `url` and waits for its load event; returns an error or None."""
    tools.events.clear()
    reply = tools.call("Page.navigate", {"url": url}, session)
    if reply.get("errorText"):
        return reply["errorText"]
    if not tools.wait_for("Page.loadEventFired", session, PAGE_TIMEOUT):
        return f"no load event within {PAGE_TIMEOUT:.0f} s"
    return None


def errors_in(events, session):
    """Script and console errors, and failed requests, among `events`."""
    found = []
    for event in events:
        if event.get("sessionId") != session:
            continue
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            found.append(f"script error: {text.splitlines()[0]}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            words = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            found.append(f"console.{params['type']}: {words}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            if urllib.parse.urlsplit(entry.get("url", "")).path in IMPLICIT_REQUESTS:
                continue
            found.append(f"console error: {entry['text']} {entry.get('url', '')}".rstrip())
    return found


def screenshot(tools, session, url, theme, path):
    """`url` in `theme`, scrolled to its first figure, saved as a PNG."""
    open_page(tools, session, url)
    tools.call("Runtime.evaluate", {"expression": f"localStorage.setItem('mdbook-theme', '{theme}')"}, session)
    open_page(tools, session, url)
    scroll = "(() => { const f = document.querySelector('main img'); if (f) f.scrollIntoView({block: 'start'}); window.scrollBy(0, -60); })()"
    tools.call("Runtime.evaluate", {"expression": scroll}, session)
    time.sleep(0.3)
    shot = tools.call("Page.captureScreenshot", {"format": "png"}, session)
    path.write_bytes(base64.b64decode(shot["data"]))


def check_book(book, screenshots, screenshot_pages):
    chromium = find_chromium()
    if chromium is None:
        print("chromium is not installed: run scripts/setup.sh (or: sudo apt-get install chromium)")
        return 2
    pages = sorted(p.relative_to(book).as_posix() for p in book.rglob("*.html"))
    if not pages:
        print(f"no HTML page under {book}: build the book first (mdbook build)")
        return 2
    server, missing_files = quiet_server(book)
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    profile = tempfile.mkdtemp(prefix="book-browser-")
    process, tools = start_chromium(chromium, profile)
    problems, links, ids = [], {}, {}
    try:
        target = tools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            tools.call(f"{domain}.enable", {}, session)
        metrics = {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}
        tools.call("Emulation.setDeviceMetricsOverride", metrics, session)
        images = 0
        for page in pages:
            missing_files.clear()
            failure = open_page(tools, session, f"{origin}/{page}")
            if failure:
                problems.append(f"{page}: does not load: {failure}")
                continue
            time.sleep(0.1)  # scripts run at load log their errors just after it
            seen = tools.call("Runtime.evaluate", {"expression": INSPECT_PAGE, "returnByValue": True}, session)
            seen = seen["result"]["value"]
            images += seen["images"]
            problems += [f"{page}: image does not render: {src}" for src in seen["broken_images"]]
            problems += [f"{page}: {error}" for error in errors_in(tools.events, session)]
            missing = [path for path in missing_files if path not in IMPLICIT_REQUESTS]
            problems += [f"{page}: requested a missing file: {path}" for path in missing]
            if page not in LINKS_NOT_CHECKED:
                links[page] = seen["links"]
            ids[(book / page).resolve()] = set(seen["ids"])
        external = set()
        for page, hrefs in links.items():
            for href in hrefs:
                local = local_target(href, origin, book)
                if local is None:
                    if not href.startswith(("javascript:", "mailto:")):
                        external.add(href)
                    continue
                file, fragment = local
                shown = href.removeprefix(origin + "/")
                if not file.is_file():
                    problems.append(f"{page}: broken link: {shown} (no such file in the book)")
                elif fragment and file.suffix == ".html" and fragment not in ids.get(file.resolve(), set()):
                    problems.append(f"{page}: broken anchor: {shown} (the page has no id `{fragment}`)")
        for href in sorted(external):
            print(f"external link (listed, not fetched): {href}")
        if screenshots:
            screenshots.mkdir(parents=True, exist_ok=True)
            for page in screenshot_pages:
                for name, theme in THEMES.items():
                    path = screenshots / f"{Path(page).stem}-{name}.png"
                    screenshot(tools, session, f"{origin}/{page}", theme, path)
                    print(f"saved {path}")
    except DevToolsError as error:
        print(f"the browser check could not drive Chromium: {error}")
        return 2
    finally:
        tools.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    for problem in problems:
        print(f"PROBLEM {problem}")
    print(f"{len(pages)} pages, {images} images, {len(external)} external links, {len(problems)} problems")
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", default="book", help="the rendered book (default: book)")
    parser.add_argument("--screenshots", help="save screenshots of --screenshot-pages here")
    parser.add_argument(
        "--screenshot-pages", default="01-collectives.html,05-bucketing.html,06-overlap.html",
        help="comma-separated pages to screenshot",
    )
    args = parser.parse_args()
    book = Path(args.book).resolve()
    shots = Path(args.screenshots) if args.screenshots else None
    pages = [p for p in args.screenshot_pages.split(",") if p]
    sys.exit(check_book(book, shots, pages))


if __name__ == "__main__":
    main()
