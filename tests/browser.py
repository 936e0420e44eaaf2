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


@dataclass
class Rendered:
    canvases: int
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # anything fetched besides the file itself


def render(path: Path, settle_ms: int = 1500) -> Rendered:
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
        browser.close()
    return Rendered(canvases=canvases, errors=errors, requests=requests)
