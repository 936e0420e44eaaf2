"""Open an HTML file in headless Debian chromium (Playwright drives it) and report what rendered."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Bokeh draws into canvases inside its views' shadow roots: walk them all.
COUNT_CANVASES = """() => {
  let n = 0;
  const walk = (root) => { for (const el of root.querySelectorAll('*')) {
      if (el.tagName === 'CANVAS' && el.width > 0 && el.height > 0) n++;
      if (el.shadowRoot) walk(el.shadowRoot); } };
  walk(document);
  return n;
}"""


# The page's text in reading order, shadow roots included (Bokeh's Divs render inside them).
PAGE_TEXT = """() => {
  const out = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) {
      const t = node.textContent.trim();
      if (t) out.push(t);
      return;
    }
    if (node.nodeName === 'SCRIPT' || node.nodeName === 'STYLE') return;
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const c of node.childNodes) walk(c);
  };
  walk(document.body);
  return out.join('\\n');
}"""


@dataclass
class Rendered:
    """What a page showed once loaded.

    Attributes:
        canvases: non-empty canvases drawn (Bokeh plots).
        errors: console errors and uncaught page errors.
        requests: anything fetched besides the file itself.
        text: the page's text in reading order, one piece a line.
    """

    canvases: int
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    text: str = ""


def render(path: Path, settle_ms: int = 1500) -> Rendered:
    """Open `path` in headless chromium, let it settle for `settle_ms`, and report what rendered."""
    chromium = shutil.which("chromium")
    assert chromium, (
        "Debian's chromium is needed (scripts/setup.sh installs it): apt-get install chromium"
    )
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    requests: list[str] = []
    url = path.resolve().as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url) if r.url != url else None)
        page.goto(url, wait_until="load")
        page.wait_for_timeout(settle_ms)
        canvases = page.evaluate(COUNT_CANVASES)
        text = page.evaluate(PAGE_TEXT)
        browser.close()
    return Rendered(canvases=canvases, errors=errors, requests=requests, text=text)
