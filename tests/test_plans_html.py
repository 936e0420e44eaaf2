"""`sparselift plan show --html` and the reports' splits: a real optimizer split plan's hot size,
hot share and parts, the collectives per step with and without its splits, refusals, and the
page needing nothing from the network.

The split plans are the optimizer's (real solver, real cost model, as `test_optimizer_splits`
builds them) and the hand-made one of `test_plans_virtual` (every kind of split).
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from plans_helpers import round_robin
from split_helpers import BATCH, split_coeffs, split_hot_ids, split_tables
from test_plans_virtual import split_plan

from sparselift import plans
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.split_options import split_options
from sparselift.optimizer.topology import preset
from sparselift.tune import TuneResult
from sparselift.tune_report import tune_sections


@pytest.fixture(scope="module")
def split_file(tmp_path_factory) -> Path:
    """The optimizer's plan with `heavy` hot/cold, its cold part made row-wise over both ranks
    and the other model-parallel tables table-wise (so the split adds an all-to-all pair)."""
    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    inp = Inputs(stats, topo, BATCH, split_coeffs(topo, 1e-12), splits=split_options(stats, 2, hot))
    doc = optimize(inp, time_limit_s=20, min_gain=0.0).plan.to_dict()
    for t in doc["tables"]:  # every other model-parallel table table-wise on rank 0
        if t["sharding_type"] not in ("data_parallel", "table_wise"):
            rows = sum(sh["sizes"][0] for sh in t["shards"] if sh["offsets"][1] == 0)
            dim = sum(sh["sizes"][1] for sh in t["shards"] if sh["offsets"][0] == 0)
            t.update(
                sharding_type="table_wise",
                ranks=[0],
                shards=[{"rank": 0, "offsets": [0, 0], "sizes": [rows, dim]}],
            )
    (cold,) = [t for t in doc["tables"] if t["name"] == "heavy__cold"]
    rows, dim = cold["shards"][0]["sizes"]
    half = rows // 2
    cold.update(
        sharding_type="row_wise",
        ranks=[0, 1],
        shards=[
            {"rank": 0, "offsets": [0, 0], "sizes": [half, dim]},
            {"rank": 1, "offsets": [half, 0], "sizes": [rows - half, dim]},
        ],
    )
    assert {t["sharding_type"] for t in doc["tables"]} == {
        "data_parallel",
        "table_wise",
        "row_wise",
    }
    path = tmp_path_factory.mktemp("split") / "split.json"
    plans.save(plans.Plan.from_dict(doc, "test"), path)  # checked as any plan file is
    return path


class _Tables(HTMLParser):
    """The rows of each <table> of an HTML fragment, as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def sections(page: str) -> dict[str, list[dict[str, str]] | str]:
    """The report's sections as Bokeh's document holds them: heading → the table under it (one
    dict per row, by column name) or the preformatted text; plots are left out."""
    (doc,) = re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    texts: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("name") == "Div" and "text" in node.get("attributes", {}):
                texts.append(html.unescape(node["attributes"]["text"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(doc))
    out: dict[str, list[dict[str, str]] | str] = {}
    heading = None
    for text in texts:
        if m := re.fullmatch(r"<h2>(.*)</h2>", text, re.S):
            heading = html.unescape(m.group(1))
        elif heading is not None and "<table" in text:
            parser = _Tables()
            parser.feed(text)
            head, *body = parser.tables[0]
            out[heading] = [dict(zip(head, row, strict=True)) for row in body]
        elif heading is not None and text.startswith("<pre>"):
            out[heading] = html.unescape(text.removeprefix("<pre>").removesuffix("</pre>"))
    return out


def _self_contained(page: str) -> None:
    """No script, stylesheet or image the page would fetch: Bokeh's JavaScript is inline (the
    scripts' bodies are left out of the search: Bokeh's code spells such tags in strings)."""
    scripts = re.findall(r"<script\b[^>]*>", page)
    assert len(scripts) >= 2 and not [s for s in scripts if "src=" in s]
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S)
    assert not re.findall(r"<(link|img|iframe)\b", markup)


def test_plan_show_html_shows_the_splits_and_the_collectives(tmp_path, cli, split_file):
    out = tmp_path / "plan.html"
    code, stdout, err = cli("plan", "show", split_file, "--html", out)
    assert code == 0, err
    assert stdout.rstrip().endswith(f"wrote {out}")
    page = out.read_text()
    _self_contained(page)
    doc = json.loads(split_file.read_text())
    (split,) = doc["splits"]
    hot_rows = len(split["hot_ids"])
    share = doc["predicted"]["splits"]["heavy"]["hot_share"]
    assert 0 < share < 1 and 0 < hot_rows < 200_000
    got = sections(page)
    assert "splits (virtual tables)" in got["Plan"]  # the text view comes first
    (row,) = got["Splits: split"]
    assert row["table"] == "heavy" and row["kind"] == "hot_cold"
    assert row["hot rows"] == f"{hot_rows:,}"
    assert row["hot share of lookups"] == f"{share:.1%}"
    assert row["hot rows' share of the table"] == f"{hot_rows / 200_000:.2%}"
    assert row["parts (rows or columns, sharding)"] == (
        f"heavy__hot: {hot_rows:,} hot rows, DP ranks 0-1; heavy__cold: 200,000 rows, RW ranks 0-1"
    )
    assert "Splits: hot share of lookups vs hot rows" in page
    (coll,) = got["Collectives per step"]
    assert coll["all-to-all pairs per step"] == "2"
    assert coll["sharding types"] == "row_wise, table_wise"
    assert coll["pairs without its splits' parts"] == "1"  # the row-wise pair is the split's
    assert coll["types without them"] == "table_wise"
    assert coll["data-parallel all-reduce"] == "yes"
    assert "2 all-to-all pairs per step (row_wise, table_wise)" in got["Plan"]  # the text agrees


def test_every_kind_of_split_is_listed_and_an_unrecorded_share_says_so(tmp_path, cli):
    path = tmp_path / "virtual.json"
    plans.save(split_plan(), path)
    out = tmp_path / "virtual.html"
    code, _, err = cli("plan", "show", path, "--html", out)
    assert code == 0, err
    page = out.read_text()
    rows = {r["table"]: r for r in sections(page)["Splits: virtual"]}
    assert list(rows) == ["t3", "t5", "t7"]
    assert rows["t3"]["hot share of lookups"] == "not recorded"
    assert rows["t3"]["hot rows"] == "1,000"
    assert rows["t5"]["parts (rows or columns, sharding)"] == (
        "t5__rows0: rows 0-20000, TW rank 0; t5__rows1: rows 20000-50000, TW rank 1"
    )
    assert rows["t7"]["parts (rows or columns, sharding)"] == (
        "t7__cols0: cols 0-16, TW rank 1; t7__cols1: cols 16-32, TW rank 0"
    )
    assert rows["t5"]["hot rows"] == "–" and rows["t7"]["kind"] == "column_slices"
    assert "Splits: hot share of lookups vs hot rows" not in page  # no share to plot


def test_an_unsplit_plan_has_no_splits_section(tmp_path, cli):
    path = tmp_path / "rr.json"
    plans.save(round_robin(2), path)
    out = tmp_path / "rr.html"
    code, _, err = cli("plan", "show", path, "--html", out)
    assert code == 0, err
    got = sections(out.read_text())
    assert not [h for h in got if h.startswith("Splits")]
    (coll,) = got["Collectives per step"]
    assert (
        coll["all-to-all pairs per step"] == "1" and "pairs without its splits' parts" not in coll
    )


def test_plan_diff_html_shows_the_split_plans_splits(tmp_path, cli, split_file):
    rr = tmp_path / "rr.json"
    plans.save(round_robin(2), rr)
    out = tmp_path / "diff.html"
    code, _, err = cli("plan", "diff", rr, split_file, "--html", out)
    assert code == 0, err
    got = sections(out.read_text())
    assert [h for h in got if h.startswith("Splits")] == ["Splits: split"]
    assert [r["plan"] for r in got["Collectives per step"]] == ["rr", "split"]


@pytest.mark.parametrize("where", ["missing-dir", "file-parent", "dir"])
def test_an_unwritable_html_is_refused_in_one_line_before_anything(tmp_path, cli, where):
    plan = tmp_path / "rr.json"
    plans.save(round_robin(2), plan)
    out = {
        "missing-dir": tmp_path / "nope" / "plan.html",
        "file-parent": plan / "plan.html",
        "dir": tmp_path,
    }[where]
    before = sorted(tmp_path.rglob("*"))
    code, stdout, err = cli("plan", "show", plan, "--html", out)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and f"cannot write {out}" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_bad_plan_is_refused_in_one_line_and_writes_nothing(tmp_path, cli):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "sparselift-plan", "version": 1}')
    out = tmp_path / "plan.html"
    code, stdout, err = cli("plan", "show", bad, "--html", out)
    assert code == 2 and stdout == "" and len(err.strip().splitlines()) == 1
    assert str(bad) in err and not out.exists()


def test_the_tune_report_shows_the_candidates_splits(tmp_path, split_file):
    rr = tmp_path / "rr.json"
    plans.save(round_robin(2), rr)
    res = TuneResult(baseline=str(rr), candidate=str(split_file), shipped="candidate", reason="t")
    got = dict(tune_sections(res, tmp_path))
    assert list(got["Splits: split"]["table"]) == ["heavy"]
    assert "Splits: rr" not in got
    assert list(got["Collectives per step"]["plan"]) == ["rr", "split"]


@pytest.mark.slow
def test_the_split_report_renders_offline(tmp_path, cli, split_file):
    from browser import render

    out = tmp_path / "plan.html"
    assert cli("plan", "show", split_file, "--html", out)[0] == 0
    page = render(out)
    assert page.errors == [] and page.requests == []
    assert page.canvases >= 4  # cost and memory, mix, placement, hot share
    assert "Collectives per step" in page.text and "heavy__hot" in page.text
