"""One self-contained HTML file: findings, HoloViews plots and tables, Bokeh's JavaScript inline.

Bokeh's `save` links its JavaScript from a CDN by default; a report must open on a machine with no
network, so everything is rendered with `bokeh.resources.INLINE` into a single file.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import holoviews as hv
import pandas as pd

from sparselift.atomic import write_bytes


@contextmanager
def _no_external_model_files() -> Iterator[None]:
    """Bokeh's INLINE resources, minus the external files other libraries' models declare.

    HoloViews imports Panel, whose models declare an ES-module shim as a relative `static/…` file;
    Bokeh adds every registered model's files to a page (through resource clones, hence the class
    attribute), so INLINE alone would leave one broken link. None of the rendered models needs it.
    """
    from bokeh.resources import Resources

    patched: Any = Resources  # typed Any: mypy does not let a method be reassigned
    original = patched._collect_external_resources
    patched._collect_external_resources = lambda self, attr: []
    try:
        yield
    finally:
        patched._collect_external_resources = original


def render_html(title: str, sections: Sequence[tuple[str, Any]]) -> str:
    """The page: `title`, then each section's heading and content, in order.

    Args:
        title: the page's title and first heading.
        sections: (heading, content); content is a DataFrame (a table), an object with
            `_repr_html_` (its HTML, e.g. `findings.Findings`), a str (preformatted text) or a
            HoloViews object (rendered by Bokeh).
    Returns:
        One HTML document that needs nothing from the network.
    """
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models.widgets.markups import Div  # where it is defined (typed)
    from bokeh.resources import INLINE

    items = [Div(text=f"<h1>{html.escape(title)}</h1>")]
    for heading, content in sections:
        items.append(Div(text=f"<h2>{html.escape(heading)}</h2>"))
        if isinstance(content, pd.DataFrame):
            items.append(Div(text=_table_html(content)))
        elif hasattr(content, "_repr_html_"):
            items.append(Div(text=f"<div style='font-size:15px'>{content._repr_html_()}</div>"))
        elif isinstance(content, str):
            items.append(Div(text=f"<pre>{html.escape(content)}</pre>"))
        else:
            items.append(hv.render(content, backend="bokeh"))
    with _no_external_model_files():
        return file_html(column(*items), INLINE, title)


def _table_html(df: pd.DataFrame, max_rows: int = 200) -> str:
    """A DataFrame as an HTML table (the first `max_rows` rows, then how many more)."""
    shown = df.head(max_rows)
    table = shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
    more = f"<p>… {len(df) - max_rows} more rows</p>" if len(df) > max_rows else ""
    return f"<div style='font-family:monospace;font-size:12px'>{table}</div>{more}"


def write_report(path: str | Path, title: str, sections: Sequence[tuple[str, Any]]) -> None:
    """Render `sections` (`render_html`) and write the page to `path` atomically."""
    write_bytes(path, render_html(title, sections).encode())
