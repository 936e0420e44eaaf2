"""`sparselift analyze DIR [--out OUT] [--html REPORT]`: the analysis stage on the command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparselift.analysis.pipeline import OUTPUTS, analyze, write_outputs


def register(sub: argparse._SubParsersAction) -> None:
    """Add `analyze` to the `sparselift` sub-commands."""
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


def run_analyze(args: argparse.Namespace) -> int:
    """Analyze args.dir, write its outputs and print the summary; 0 on success."""
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
