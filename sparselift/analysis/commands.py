"""`sparselift analyze DIR [--out OUT]`: graph, summary and calibration of a profile directory.

Everything is computed before anything is written, and each file is written to a temp name then
renamed, so bad input (exit 2) leaves no output behind.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sparselift.analysis.names import SPARSE_STAGES
from sparselift.errors import UserError

OUTPUTS = ("nodes.parquet", "edges.parquet", "summary.parquet", "calibration.json")


@dataclass
class Analysis:
    """Everything `analyze` computes, for notebooks and benchmarks."""

    nodes: pd.DataFrame
    edges: pd.DataFrame
    steps: pd.DataFrame
    summary: pd.DataFrame
    critical_path: pd.DataFrame
    calibration: object  # calibration.Calibration
    unplaced: list[str]
    manifest: dict  # the profile's, as read and checked
    access_stats: pd.DataFrame | None


def register(sub) -> None:
    p = sub.add_parser(
        "analyze", help="rebuild the sparse path of a profile, summarize it and calibrate costs"
    )
    p.add_argument("dir", metavar="DIR", help="profile directory (from `sparselift profile`)")
    p.add_argument("--out", default=None, metavar="OUT", help="output directory (default: DIR)")
    p.add_argument(
        "--no-cache", action="store_true", help="do not read or write the parsed-trace cache"
    )
    p.add_argument(
        "--html", default=None, metavar="REPORT", help="also write a self-contained HTML report"
    )
    p.set_defaults(run=run_analyze)


def analyze(path: str | Path, cache: bool = True, progress=None) -> Analysis:
    """Profile directory → Analysis (raises UserError on bad input)."""
    from sparselift.analysis.calibration import calibrate
    from sparselift.analysis.profile import load_profile
    from sparselift.analysis.reconstruct import build_graph
    from sparselift.analysis.summary import critical_path, summarize

    prof = load_profile(path, cache=cache, progress=progress)
    graph = build_graph(prof.traces, prof.plan_tables)
    sparse = graph.nodes["stage"].isin(SPARSE_STAGES)
    for r, tr in enumerate(prof.traces):
        if not (sparse & (graph.nodes["rank"] == r)).any():
            raise UserError(
                f"{tr.path}: no sparse-path events (no TorchRec input_dist / lookup / output_dist "
                f"annotations in the profiled steps)"
            )
    summary = summarize(graph.nodes, graph.steps)
    cal = calibrate(
        graph.nodes, graph.steps, prof.manifest, str(path), prof.access_stats, prof.plan_tables
    )
    return Analysis(
        nodes=graph.nodes,
        edges=graph.edges,
        steps=graph.steps,
        summary=summary,
        critical_path=critical_path(graph.nodes, summary),
        calibration=cal,
        unplaced=graph.unplaced,
        manifest=prof.manifest,
        access_stats=prof.access_stats,
    )


def write_outputs(a: Analysis, out: Path) -> None:
    """All four files, each atomically; the bytes are all built before the first write."""
    from sparselift.atomic import json_bytes, parquet_bytes, write_bytes

    blobs = {
        name: parquet_bytes(df)
        for name, df in (
            ("nodes.parquet", a.nodes),
            ("edges.parquet", a.edges),
            ("summary.parquet", a.summary),
        )
    }
    blobs["calibration.json"] = json_bytes(a.calibration.to_dict())
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create output directory ({e.strerror})") from None
    for name in OUTPUTS:
        write_bytes(out / name, blobs[name])


def run_analyze(args: argparse.Namespace) -> int:
    from sparselift.analysis.summary import format_summary

    a = analyze(args.dir, cache=not args.no_cache, progress=lambda line: print(line, flush=True))
    out = Path(args.out or args.dir)
    write_outputs(a, out)
    print(format_summary(a.summary, a.critical_path))
    if a.unplaced:
        print(f"could not place ({len(a.unplaced)}):")
        for line in a.unplaced:
            print(f"  {line}")
    cal = a.calibration
    print(
        "calibration: "
        + ", ".join(
            f"{k} a={v.a_s * 1e3:.3f}ms"
            + (f" sync={v.sync_s * 1e3:.3f}ms" if v.sync_s else "")
            + f" b={v.b_s:.3g}/{v.x} r2={v.r2:.2f} n={v.n}"
            for k, v in cal.ops.items()
        )
        + f"; dense_step {cal.dense_step_s * 1e3:.2f} ms"
    )
    print(f"wrote {', '.join(OUTPUTS)} to {out}")
    if args.html:
        from sparselift.analysis.report import write_report
        from sparselift.analysis.views import open_profile, profile_sections

        write_report(
            args.html,
            f"SparseLift profile: {args.dir}",
            profile_sections(open_profile(args.dir, a)),
        )
        print(f"wrote {args.html}")
    return 0
