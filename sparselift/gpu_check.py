"""The GPU check's Python steps (`scripts/gpu_check.sh`): its plans, and its report.

The check profiles a few 1-rank CUDA runs (tiny fused; multihot-26 fused and UVM-cached at two
cache sizes) and needs three things the other commands do not give:

* `write_plan` (here): a round-robin plan with its tables' compute kernel (and cache load factor)
  set;
* `kernel_stages` (`gpu_check_stages.py`): on a CUDA profile, every GPU kernel matched to the
  sparse stage whose host op launched it — the device time of each stage, which the host-side
  calibration cannot see;
* `report` (`gpu_check_report.py`; its text, `summary_text`, in `gpu_check_summary.py`): per run
  the fitted lookup coefficients beside the h100x8 / h200x8 presets' own, and per UVM-cached run
  its measured miss cost, in the presets' unit (`Coefficients.uvm_miss_b_s`, seconds per
  element), from the step and from the GPU kernel time.

Per step means per rank and step (the check runs 1 rank).

`python -m sparselift.gpu_check plan|report …` runs them; bad input is one line, exit 2. The
names of the other modules are importable from here too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.gpu_check_report import (
    FORMAT,
    PRESETS,
    VERSION,
    Run,
    miss_elements,
    preset_coefficients,
    report,
    step_s,
    write_report,
)
from sparselift.gpu_check_stages import LOOKUP_KINDS, NAME_KINDS, kernel_stages
from sparselift.gpu_check_summary import summary_text


def write_plan(src: str | Path, dst: str | Path, kernel: str, load_factor: float | None) -> None:
    """Write `src` (a plan file) to `dst` with every table's kernel and cache share set.

    Args:
        src: a SparseLift plan (e.g. from `sparselift plan round-robin`).
        dst: where to write the edited plan (atomically).
        kernel: the compute kernel for every table.
        load_factor: the cache load factor (only with "fused_uvm_caching").
    Raises:
        UserError: `src` is unreadable, or the edited plan fails the plan checks (a UVM kernel on a
            CPU topology, a load factor outside (0, 1]).
    """
    from sparselift.atomic import write_bytes
    from sparselift.plans import load

    try:
        d = json.loads(Path(src).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{src}: cannot read the plan ({e.__class__.__name__})") from None
    if load_factor is not None and not 0 < load_factor <= 1:
        raise UserError(f"{dst}: cache load factor must be in (0, 1], got {load_factor}")
    for t in d.get("tables", []):
        t["compute_kernel"] = kernel
        t["cache_load_factor"] = load_factor
    data = (json.dumps(d, indent=1, sort_keys=True) + "\n").encode()
    tmp = Path(dst).with_name(Path(dst).name + ".check.json")
    write_bytes(tmp, data)
    try:
        load(tmp)  # the plan checks (raises PlanError, a user error)
    finally:
        tmp.unlink(missing_ok=True)
    write_bytes(dst, data)


def parse_run(text: str) -> Run:
    """A run from `NAME=DIR[,kernel=K][,lf=F][,baseline=B][,stand_in=1]`.

    Raises:
        UserError: a malformed run argument.
    """
    head, _, rest = text.partition(",")
    name, eq, profile = head.partition("=")
    if not eq or not name or not profile:
        raise UserError(f"--run {text!r}: expected NAME=DIR[,kernel=K][,lf=F][,baseline=B]")
    kw: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        k, eq, v = part.partition("=")
        if not eq or k not in ("kernel", "lf", "baseline", "stand_in"):
            raise UserError(f"--run {text!r}: unknown option {part!r}")
        if k == "lf":
            try:
                kw["cache_load_factor"] = float(v)
            except ValueError:
                raise UserError(f"--run {text!r}: lf must be a number, got {v!r}") from None
        elif k == "stand_in":
            kw["stand_in"] = v not in ("0", "false", "")
        else:
            kw[k] = v
    return Run(name=name, profile=profile, **kw)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sparselift.gpu_check plan SRC DST --kernel K [--lf F]` or
    `report --out DIR --run NAME=DIR[,…] …`; 0 on success, 2 with one line on bad input."""
    ap = argparse.ArgumentParser(prog="python -m sparselift.gpu_check")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="a plan with every table's kernel (and cache share) set")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--kernel", required=True)
    p.add_argument("--lf", type=float, default=None)
    r = sub.add_parser("report", help="write gpu_check.json and gpu_check.txt")
    r.add_argument("--out", required=True)
    r.add_argument("--run", action="append", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "plan":
            write_plan(args.src, args.dst, args.kernel, args.lf)
            print(f"wrote {args.dst} ({args.kernel}" + (f", lf {args.lf})" if args.lf else ")"))
        else:
            runs = [parse_run(x) for x in args.run]
            rep = write_report(runs, args.out)
            print(summary_text(rep), end="")
            print(f"wrote {args.out}/gpu_check.json, {args.out}/gpu_check.txt")
    except Exception as e:  # noqa: BLE001 - user errors (ours, PlanError) are one line
        if getattr(e, "is_user_error", False):
            print(f"gpu_check: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "FORMAT",
    "LOOKUP_KINDS",
    "NAME_KINDS",
    "PRESETS",
    "VERSION",
    "Run",
    "kernel_stages",
    "main",
    "miss_elements",
    "parse_run",
    "preset_coefficients",
    "report",
    "step_s",
    "summary_text",
    "write_plan",
    "write_report",
]
