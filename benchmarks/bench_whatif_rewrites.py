"""What splits are worth at scale, by SparseLift's own model: the what-if corpus at 64 and 128
ranks of h100x8, each workload solved without and with splits on offer.

The corpus is `synthetic.whatif_corpus` (as bench_whatif_corpus.py). Every coefficient is the
h100x8 preset's, *assumed*: no profile of that hardware exists; the batch transform is priced at
`cost_model.ASSUMED_TRANSFORM_MARGIN` × its preset cost, and the hot/cold splits' hot sets come
from each table's Zipf law (`split_options.hot_cold_from_zipf`; ids are placeholders: the plans
are priced, not written). Both solves are `optimize` with SparseLift's model alone
(`two_models=False`); `sparselift optimize` itself offers no splits to what-if GPU plans, as
TorchRec's estimator, which those answer to, cannot price them. So this is what the rewrites
would be worth if the model's assumed terms hold, not a measured gain.

Printed per workload and world size: the step without and with splits, their ratio, and the
splits chosen by kind; then the geomean ratio per world size.

    .venv/bin/python benchmarks/bench_whatif_rewrites.py --workloads 10
    .venv/bin/python benchmarks/bench_whatif_rewrites.py --quick
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from typing import Any

from corpus_args import corpus_parser, parse_corpus_args

from sparselift.atomic import write_bytes
from sparselift.optimizer.coefficients import from_topology
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.split_options import split_options
from sparselift.optimizer.synthetic import whatif_corpus
from sparselift.optimizer.topology import preset

DEVICE = "h100x8"
DENSE_STEP_S = 0.005  # the same dense step for both solves: it cancels in neither ratio's favour


def run_one(stats: list[Any], batch: int, ranks: int, time_limit_s: float) -> dict[str, Any]:
    """One workload at `ranks`: the step without and with splits on offer, and what was split."""
    topo = preset(DEVICE, ranks)
    coeffs = from_topology(topo, DENSE_STEP_S)
    hottest = {s.name: range(min(s.num_embeddings, 65_536)) for s in stats}
    offered = split_options(stats, ranks, hottest=hottest)
    row: dict[str, Any] = {"ranks": ranks, "tables": len(stats), "batch": batch}
    for label, splits in (("plain", {}), ("splits", offered)):
        t0 = time.perf_counter()
        inp = Inputs(stats, topo, batch, coeffs, splits=splits)
        res = optimize(inp, time_limit_s=time_limit_s, two_models=False)
        row[f"{label}_ms"] = res.cost.step_time_s * 1e3
        row[f"{label}_solve_s"] = time.perf_counter() - t0
        if splits:
            row["chosen"] = dict(Counter(s.kind for s in res.plan.splits))
    row["offered"] = sum(len(v) for v in offered.values())
    row["ratio"] = row["plain_ms"] / row["splits_ms"]
    return row


def main() -> int:
    ap = corpus_parser(
        "SparseLift's model's step with and without splits on the what-if corpus",
        "3 small workloads at 64 ranks",
    )
    args = parse_corpus_args(ap, {"workloads": 3, "ranks": [64], "max_tables": 40})
    ranks = [r for r in args.ranks if r > 1]
    rows = []
    print(
        f"{'seed':>4s} {'ranks':>5s} {'tables':>6s} {'plain ms':>9s} {'splits ms':>9s} "
        f"{'ratio':>6s}  chosen (of offered)"
    )
    for w in whatif_corpus(args.workloads, args.min_tables, args.max_tables):
        for r in ranks:
            row = {"seed": w.seed, **run_one(w.stats, w.batch_size, r, args.time_limit)}
            rows.append(row)
            chosen = ", ".join(f"{n} {k}" for k, n in sorted(row["chosen"].items())) or "none"
            print(
                f"{w.seed:4d} {r:5d} {row['tables']:6d} {row['plain_ms']:9.3f} "
                f"{row['splits_ms']:9.3f} {row['ratio']:6.3f}  {chosen} ({row['offered']})",
                flush=True,
            )
    for r in ranks:
        ratios = [x["ratio"] for x in rows if x["ranks"] == r]
        if ratios:
            geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
            print(
                f"{r} ranks: geomean {geo:.3f}x (min {min(ratios):.3f}, max {max(ratios):.3f}) "
                f"over {len(ratios)} workloads; every coefficient assumed ({DEVICE} preset)"
            )
    if args.json:
        write_bytes(args.json, json.dumps(rows, indent=1).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
