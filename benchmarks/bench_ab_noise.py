"""How precisely an A/B measures: side by side in one job against separate jobs, interleaved.

Per workload, two A/Bs: TorchRec's plan against a byte-identical copy of itself (A/A: the true
ratio is 1), and TorchRec's plan against the round-robin reference (a real difference). Each is
measured `--repeats` times by each method (`sparselift bench`'s two modes, `--rounds` rounds ×
`--steps` steps), the methods alternating repeat by repeat. Printed per method: each repeat's
median per-round ratio and its 95 % bootstrap interval (`compare.ratio_interval`, what `tune`
ships on), the A/A error |ratio − 1| and how often the A/A interval excludes 1 (a false verdict),
and the wall time.

    .venv/bin/python benchmarks/bench_ab_noise.py [--workloads tiny multihot-26] [--repeats 3]
        [--rounds 5] [--steps 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_plans

from sparselift.analysis.compare import ratio_interval
from sparselift.bench import Contender, run_bench
from sparselift.workloads.harness import TrainConfig

MAX_ROWS = {"tiny": None, "multihot-26": 200_000, "criteo-kaggle": 200_000}
METHODS = {"side by side": False, "separate jobs": True}  # name → run_bench's separate_runs


def write_plans(workload: str, nproc: int, out: Path) -> dict[str, Path]:
    """TorchRec's plan, a byte-identical copy and the round-robin plan (`bench_plans`), in
    `out`."""
    torchrec, rr = bench_plans.write_plans(workload, MAX_ROWS.get(workload), nproc, out)
    copy = out / f"{workload}.copy.json"
    shutil.copyfile(torchrec, copy)
    return {"torchrec": torchrec, "copy": copy, "round-robin": rr}


def measure(cfg: TrainConfig, paths: dict[str, Path], rounds: int, separate: bool) -> dict:
    """One A/B run of TorchRec's plan, its copy and round-robin: ratios over TorchRec's per
    round, (median, low, high) of each, and the wall time."""
    contenders = [Contender(name, str(paths[name])) for name in ("torchrec", "copy", "round-robin")]
    t0 = time.perf_counter()
    run_bench(cfg, contenders, rounds, separate_runs=separate)
    wall = time.perf_counter() - t0
    base = contenders[0].steps_per_s
    out: dict[str, Any] = {"wall_s": wall}
    out["steps_per_s"] = {c.label: c.steps_per_s for c in contenders}
    for c in contenders[1:]:
        per_round = [x / b for x, b in zip(c.steps_per_s, base, strict=True)]
        out[c.label] = dict(zip(("ratio", "low", "high"), ratio_interval(per_round), strict=True))
    return out


def summary(runs: list[dict]) -> str:
    """One method's repeats in a few lines."""
    aa = [r["copy"] for r in runs]
    errors = [abs(a["ratio"] - 1.0) for a in aa]
    false = sum(1 for a in aa if a["low"] > 1.0 or a["high"] < 1.0)
    rr = [r["round-robin"] for r in runs]
    return "\n".join(
        [
            "    A/A ratio (95 % interval): "
            + ", ".join(f"{a['ratio']:.3f} ({a['low']:.3f}-{a['high']:.3f})" for a in aa),
            f"    A/A |ratio - 1|: median {statistics.median(errors):.3f}, max {max(errors):.3f};"
            f" interval excludes 1 in {false} of {len(aa)}",
            "    round-robin / TorchRec: "
            + ", ".join(f"{a['ratio']:.3f} ({a['low']:.3f}-{a['high']:.3f})" for a in rr),
            f"    wall {statistics.median(r['wall_s'] for r in runs):.0f} s a run (median)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["tiny", "multihot-26"])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ab-noise-") as tmp:
        for workload in args.workloads:
            paths = write_plans(workload, args.nproc, Path(tmp))
            cfg = TrainConfig(
                workload=workload,
                nproc=args.nproc,
                steps=args.steps,
                max_rows=MAX_ROWS.get(workload),
            )
            runs: dict[str, list[dict]] = {m: [] for m in METHODS}
            for k in range(args.repeats):
                order = list(METHODS) if k % 2 == 0 else list(METHODS)[::-1]
                for method in order:
                    runs[method].append(measure(cfg, paths, args.rounds, METHODS[method]))
                    print(f"{workload}: repeat {k + 1} {method} done", file=sys.stderr, flush=True)
            results[workload] = runs
            print(f"{workload} ({args.rounds} rounds × {args.steps} steps, {args.repeats} repeats)")
            for method, method_runs in runs.items():
                print(f"  {method}:\n{summary(method_runs)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
