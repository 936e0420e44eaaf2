"""One self-contained HTML file: HoloViews plots and summary tables, Bokeh's JavaScript inline.

Bokeh's `save` links its JavaScript from a CDN by default; a report must open on a machine with no
network, so everything is rendered with `bokeh.resources.INLINE` into a single file.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import holoviews as hv
import pandas as pd

from sparselift.atomic import write_bytes


@contextmanager
def _no_external_model_files():
    """Bokeh's INLINE resources, minus the external files other libraries' models declare.

    HoloViews imports Panel, whose models declare an ES-module shim as a relative `static/…` file;
    Bokeh adds every registered model's files to a page (through resource clones, hence the class
    attribute), so INLINE alone would leave one broken link. None of the rendered models needs it.
    """
    from bokeh.resources import Resources

    original = Resources._collect_external_resources
    Resources._collect_external_resources = lambda self, attr: []
    try:
        yield
    finally:
        Resources._collect_external_resources = original


def render_html(title: str, sections: Sequence[tuple[str, Any]]) -> str:
    """`sections`: (heading, HoloViews object | DataFrame | str) in page order."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import Div

    items = [Div(text=f"<h1>{html.escape(title)}</h1>")]
    for heading, content in sections:
        items.append(Div(text=f"<h2>{html.escape(heading)}</h2>"))
        if isinstance(content, pd.DataFrame):
            items.append(Div(text=_table_html(content)))
        elif isinstance(content, str):
            items.append(Div(text=f"<pre>{html.escape(content)}</pre>"))
        else:
            items.append(hv.render(content, backend="bokeh"))
    from bokeh.resources import INLINE

    with _no_external_model_files():
        return file_html(column(*items), INLINE, title)


def _table_html(df: pd.DataFrame, max_rows: int = 200) -> str:
    shown = df.head(max_rows)
    table = shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
    more = f"<p>… {len(df) - max_rows} more rows</p>" if len(df) > max_rows else ""
    return f"<div style='font-family:monospace;font-size:12px'>{table}</div>{more}"


def write_report(path: str | Path, title: str, sections: Sequence[tuple[str, Any]]) -> None:
    write_bytes(path, render_html(title, sections).encode())
