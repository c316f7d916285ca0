"""A headless Chromium, driven over the DevTools protocol as a person would use it: open a page,
wait for something to show, click it with the mouse, type into a field, take a screenshot.

Only what the tests need, on websocket-client (no Selenium, no Playwright). `chromium()` says
where the browser is, or None: a test skips without one (CI installs Debian's `chromium`).
Every wait has a deadline and ends in an assertion that says what did not show."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path

import websocket

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_CHROMIUM = "no Chromium here for the browser tests (Debian: apt install chromium)"


def chromium() -> str | None:
    """The path of a Chromium (or Chrome) on PATH, or None."""
    return next((path for name in NAMES if (path := shutil.which(name))), None)


class Browser:
    """One headless Chromium with one tab. Use it as a context manager: it ends the browser."""

    def __init__(self, folder: Path, width: int = 1280, height: int = 900) -> None:
        self.folder = folder
        profile = folder / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "chromium.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            [chromium() or "chromium", "--headless=new", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "--no-sandbox", "--no-first-run",
             "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
             "--disable-background-networking", f"--window-size={width},{height}",
             "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._ids = itertools.count(1)
        self._socket = websocket.create_connection(
            self._page_socket(profile), timeout=60, suppress_origin=True
        )
        self.send("Page.enable")
        self.send("Runtime.enable")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _page_socket(self, profile: Path, timeout: float = 60) -> str:
        """The DevTools address of the browser's tab: its port comes in DevToolsActivePort."""
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"Chromium stopped at start:\n{self.log_text()[-2000:]}")
            if port_file.exists() and len(lines := port_file.read_text().split()) == 2:
                port = int(lines[0])
                try:
                    tabs = json.loads(_get(f"http://127.0.0.1:{port}/json/list"))
                except OSError:
                    tabs = []
                pages = [t["webSocketDebuggerUrl"] for t in tabs if t.get("type") == "page"]
                if pages:
                    return pages[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"Chromium opened no tab in {timeout} s:\n"
                                   f"{self.log_text()[-2000:]}")  # fmt: skip
            time.sleep(0.2)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        try:
            self._socket.close()
        except (OSError, AttributeError):
            pass
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    # ---- the protocol -------------------------------------------------------------------

    def send(self, method: str, **params) -> dict:
        """Call a DevTools method and return its result (the page's events are passed over)."""
        call = next(self._ids)
        self._socket.send(json.dumps({"id": call, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") != call:
                continue
            if "error" in message:
                raise RuntimeError(f"{method}: {message['error']}")
            return message["result"]

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        answer = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            thrown = details.get("exception", {}).get("description") or details.get("text")
            raise RuntimeError(f"the page threw: {thrown}\nin: {expression}")
        return answer["result"].get("value")

    # ---- as a person uses it -------------------------------------------------------------

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_until("document.readyState === 'complete'", f"the page {url} to load")

    def url(self) -> str:
        return self.evaluate("location.href")

    def wait_until(self, condition: str, what: str, timeout: float = 60):
        """Wait until the JavaScript `condition` is truthy in the page, and return its value;
        past the deadline, fail the test, naming `what` it waited for."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(condition)
            except RuntimeError:  # the page is changing under us (a navigation)
                value = None
            if value:
                return value
            assert time.monotonic() < deadline, (
                f"waited {timeout:.0f} s for {what}; the page was {self.url()}, showing:\n"
                f"{self.text()[-1500:]}"
            )
            time.sleep(0.25)

    def wait_for(self, selector: str, text: str = "", timeout: float = 60) -> None:
        """Wait until an element of `selector` (whose text holds `text`) shows."""
        what = f"{selector} showing {text!r}" if text else selector
        self.wait_until(f"!!{_find(selector, text)}", what, timeout)

    def texts(self, selector: str) -> list[str]:
        """The text of each element of `selector` that shows, in order."""
        return self.evaluate(
            f"[...document.querySelectorAll({json.dumps(selector)})]"
            ".filter(e => e.getClientRects().length).map(e => e.innerText.trim())"
        )

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def click(self, selector: str, text: str = "", timeout: float = 60) -> None:
        """Click, with the mouse, the middle of the element of `selector` (whose text holds
        `text`) once it shows. A page that draws the element again between the wait and the
        click (JupyterLab's menu bar, as its plugins start) is waited for again."""
        deadline = time.monotonic() + timeout
        while True:
            self.wait_for(selector, text, max(deadline - time.monotonic(), 1))
            box = self.evaluate(
                f"(() => {{ const e = {_find(selector, text)}; if (!e) return null;"
                " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                " return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()"
            )
            if box is not None:
                break
        at = {"x": box["x"], "y": box["y"]}
        self.send("Input.dispatchMouseEvent", type="mouseMoved", **at)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, button="left", clickCount=1, **at)

    def type_into(self, selector: str, words: str) -> None:
        """Focus the field of `selector` and type `words` into it."""
        self.wait_for(selector)
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=words)

    def press(self, key: str, code: str, key_code: int, modifiers: int = 0) -> None:
        """Press and release one key (modifiers: 1 Alt, 2 Ctrl, 4 Meta, 8 Shift)."""
        keys = {"key": key, "code": code, "windowsVirtualKeyCode": key_code,
                "modifiers": modifiers}  # fmt: skip
        self.send("Input.dispatchKeyEvent", type="rawKeyDown", **keys)
        self.send("Input.dispatchKeyEvent", type="keyUp", **keys)

    def screenshot(self, path: Path) -> Path:
        shot = self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


def _find(selector: str, text: str) -> str:
    """JavaScript for the first element of `selector` that shows and whose text holds `text`."""
    return (
        f"[...document.querySelectorAll({json.dumps(selector)})].find(e =>"
        f" e.getClientRects().length && e.innerText.includes({json.dumps(text)}))"
    )


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()
