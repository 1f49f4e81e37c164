"""scripts/browser_devtools.py: a minimal client of Chromium's DevTools
protocol over `--remote-debugging-pipe` (JSON messages, each ended by a NUL
byte, commands on the browser's fd 3 and replies and events on its fd 4),
for scripts/check_book_in_browser.py. Not run on its own; its test is
scripts/test_check_book_in_browser.py.
"""

import json
import os
import select
import time


class DevToolsError(Exception):
    """The browser replied with an error, closed its pipe, or went silent."""


class DevTools:
    def __init__(self, to_browser, from_browser, timeout=60.0):
        self._out, self._in = to_browser, from_browser
        self._buffer = b""
        self._next_id = 0
        self.timeout = timeout
        # Every event received so far (the caller clears it between pages).
        self.events = []

    def close(self):
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read_message(self, deadline):
        """The next message, or None at the deadline."""
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._in], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise DevToolsError("Chromium closed its DevTools pipe (did it crash?)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=None):
        """Sends a command and returns its result, keeping the events read meanwhile."""
        self._next_id += 1
        command = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        os.write(self._out, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._read_message(deadline)
            if message is None:
                raise DevToolsError(f"no reply to {method} within {self.timeout:.0f} s")
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise DevToolsError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, method, session, timeout):
        """Waits for event `method` of `session` (it may have come already); False at the timeout."""
        deadline = time.monotonic() + timeout
        seen = lambda: any(e["method"] == method and e.get("sessionId") == session for e in self.events)
        while not seen():
            message = self._read_message(deadline)
            if message is None:
                return False
            if "method" in message:
                self.events.append(message)
        return True
