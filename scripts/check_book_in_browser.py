#!/usr/bin/env python3
"""Opens every page of the rendered book in headless Chromium and fails on
what a reader would see broken.

Run (after `mdbook build`; the suite's `browser` check does both):
    .venv/bin/python scripts/check_book_in_browser.py
    .venv/bin/python scripts/check_book_in_browser.py --book book --screenshots docs/screenshots
Its own test: .venv/bin/python scripts/test_check_book_in_browser.py

Each page of --book is served by a loopback HTTP server (127.0.0.1, a free
port) and opened in Debian's Chromium through Selenium and Debian's
chromedriver (`apt-get install chromium chromium-driver`, and selenium in
.venv: scripts/setup.sh does both). A problem is:
  - a page that does not load: the page, or the page it redirects to,
    answers with an HTTP error or fails, or no load within 30 s;
  - an image that does not render (not complete, or naturalWidth == 0);
  - a link to a page or file of the book that does not exist, or to an
    #anchor that its page does not have;
  - a script error (an uncaught exception) or a console error
    (console.error, console.assert, a blocked resource);
  - a file of the book that a page asks for and does not get;
  - any request for another address than the loopback server.
Links to other sites are listed, never fetched. With --screenshots DIR it
saves the pages of --screenshot-pages in the light and the dark (navy)
theme, each scrolled to its first figure. The last line is
`N pages, N images, N external links, N problems`; the exit status is 1
when there is a problem, 2 when the check itself could not run.
"""

import argparse
import functools
import http.server
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

THEMES = {"light": "light", "dark": "navy"}
PAGE_TIMEOUT = 30
# A browser asks for /favicon.ico by itself on a page that names no icon
# (mdBook's toc.html, for readers without JavaScript): not the book's request.
IMPLICIT_REQUESTS = ("/favicon.ico",)
# mdBook's page for a missing URL roots its links at the site's root
# (<base href="/">), so its heading's own anchor points at index.html when
# read as a file of the book: its links are not checked.
LINKS_NOT_CHECKED = ("404.html",)

# Runs in the page after its load event: what it shows and links to.
INSPECT_PAGE = """
return {
  broken_images: [...document.images]
    .filter(img => !img.complete || img.naturalWidth === 0)
    .map(img => img.getAttribute('src')),
  images: document.images.length,
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id)
    .concat([...document.querySelectorAll('a[name]')].map(a => a.name)),
};
"""


def start_server(book):
    handler = functools.partial(QuietHandler, directory=str(book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def start_chromium(profile):
    """Headless Chromium under chromedriver, logging the console and the network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--no-default-browser-check", "--disable-extensions", "--disable-sync",
        "--disable-background-networking", "--disable-component-update",
        "--hide-scrollbars", "--mute-audio",
        # The book must not need the network, and this machine may have none:
        # every request off loopback goes to a closed port and fails at once
        # (a request to a bare IP address would otherwise hang until a timeout).
        "--proxy-server=127.0.0.1:9",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    options.add_experimental_option("perfLoggingPrefs", {"enableNetwork": True, "enablePage": False})
    # Naming chromedriver keeps Selenium Manager, which downloads drivers, out of it.
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_page_load_timeout(PAGE_TIMEOUT)
    # The page itself 1280 x 900 (a window of that size is smaller inside).
    metrics = {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver


def network_problems(entries, origin):
    """Requests off loopback, and files of the book the page did not get, from
    chromedriver's performance log (DevTools' Network events)."""
    urls, failed, problems = {}, {}, []
    for entry in entries:
        message = json.loads(entry["message"])["message"]
        method, params = message["method"], message["params"]
        if method == "Network.requestWillBeSent":
            url = urls[params["requestId"]] = params["request"]["url"]
            parts = urllib.parse.urlsplit(url)
            if parts.scheme in ("http", "https", "ws", "wss") and f"{parts.scheme}://{parts.netloc}" != origin:
                problems.append(f"request to another address: {url}")
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            failed.setdefault(params["requestId"], (params["type"], f"HTTP {params['response']['status']}"))
        elif method == "Network.loadingFailed":
            # A script or stylesheet answered with an HTTP error is then also
            # cancelled: one problem per request, its first.
            failed.setdefault(params["requestId"], (params["type"], params["errorText"]))
    for request, (kind, failure) in failed.items():
        url = urls.get(request, "")
        if not url.startswith(origin + "/") or urllib.parse.urlsplit(url).path in IMPLICIT_REQUESTS:
            continue  # reported above as another address, or the browser's own request
        path = url.removeprefix(origin + "/")
        if kind == "Document":
            problems.append(f"does not load: {failure} for {path}")
        else:
            problems.append(f"failed to load: {path} ({failure})")
    return problems


def console_problems(entries, origin):
    """Script and console errors, from chromedriver's browser log."""
    problems = []
    for entry in entries:
        if entry["level"] != "SEVERE" or entry["source"] == "network":
            continue  # failed requests: network_problems reads them in full
        # "URL LINE:COLUMN TEXT" -> "TEXT (PAGE LINE:COLUMN)"
        text = entry["message"].replace(origin + "/", "")
        found = re.fullmatch(r"(\S+ \d+:\d+) (.*)", text, re.DOTALL)
        if found:
            text = f"{found[2]} ({found[1]})"
        kind = "script error" if entry["source"] == "javascript" else "console error"
        problems.append(f"{kind}: {text.splitlines()[0]}")
    return problems


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


def link_problems(links, ids, origin, book):
    """Broken links and anchors among every page's links; and the external ones."""
    problems, external = [], set()
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
    return problems, external


def screenshot(driver, url, theme, path):
    """`url` in `theme`, scrolled to its first figure, saved as a PNG."""
    driver.get(url)
    driver.execute_script("localStorage.setItem('mdbook-theme', arguments[0])", theme)
    driver.get(url)
    driver.execute_script("const f = document.querySelector('main img'); if (f) f.scrollIntoView({block: 'start'}); window.scrollBy(0, -60);")
    time.sleep(0.3)  # the scroll and the theme's fonts settle
    driver.save_screenshot(str(path))


def check_book(book, screenshots, screenshot_pages):
    missing = [tool for tool in ("chromium", "chromedriver") if shutil.which(tool) is None]
    if missing:
        print(f"{' and '.join(missing)} not installed: run scripts/setup.sh (or: apt-get install chromium chromium-driver)")
        return 2
    try:
        from selenium.common.exceptions import WebDriverException
    except ImportError:
        print("selenium is not installed in this Python: run scripts/setup.sh, and run this with .venv/bin/python")
        return 2
    pages = sorted(p.relative_to(book).as_posix() for p in book.rglob("*.html"))
    if not pages:
        print(f"no HTML page under {book}: build the book first (mdbook build)")
        return 2
    server = start_server(book)
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    profile = tempfile.mkdtemp(prefix="book-browser-")
    driver = None
    problems, links, ids, images = [], {}, {}, 0
    try:
        driver = start_chromium(profile)
        # What Chromium did before the first page (its new-tab page) is not the book's.
        for log in ("browser", "performance"):
            driver.get_log(log)
        for page in pages:
            found = []
            try:
                driver.get(f"{origin}/{urllib.parse.quote(page)}")
            except WebDriverException as error:
                found.append(f"does not load: {error.msg}")
            found += network_problems(driver.get_log("performance"), origin)
            found += console_problems(driver.get_log("browser"), origin)
            problems += [f"{page}: {problem}" for problem in found]
            if any(problem.startswith("does not load") for problem in found):
                continue  # what it shows is an error page, not the book's
            seen = driver.execute_script(INSPECT_PAGE)
            images += seen["images"]
            problems += [f"{page}: image does not render: {src}" for src in seen["broken_images"]]
            if page not in LINKS_NOT_CHECKED:
                links[page] = seen["links"]
            ids[(book / page).resolve()] = set(seen["ids"])
        found, external = link_problems(links, ids, origin, book)
        problems += found
        for href in sorted(external):
            print(f"external link (listed, not fetched): {href}")
        if screenshots:
            screenshots.mkdir(parents=True, exist_ok=True)
            for page in screenshot_pages:
                for name, theme in THEMES.items():
                    path = screenshots / f"{Path(page).stem}-{name}.png"
                    screenshot(driver, f"{origin}/{page}", theme, path)
                    print(f"saved {path}")
    except WebDriverException as error:
        print(f"the browser check could not drive Chromium: {error.msg}")
        return 2
    finally:
        if driver is not None:
            driver.quit()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    for problem in problems:
        print(f"PROBLEM {problem}")
    print(f"{len(pages)} pages, {images} images, {len(external)} external links, {len(problems)} problems")
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
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
