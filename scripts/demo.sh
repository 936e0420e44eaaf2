#!/usr/bin/env bash
# The README's demo on 2 CPU ranks (gloo): `sparselift tune` profiles TorchRec's plan, plans from
# the profile, profiles SparseLift's plan and re-plans, then measures both side by side and keeps
# SparseLift's plan only if it measured faster. Then the report and the plans' comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${DEMO_OUT:-runs/demo}
# eight tables, two of which (pooling factor 150 each) take 98 % of the lookups: a load that
# TorchRec's planner, called as a trainer calls it, does not see (it puts both on one rank), and
# a profile does
workload=${DEMO_WORKLOAD:-benchmarks/workloads/two-heavy-tables.json}
max_rows=${DEMO_MAX_ROWS:-}
rows=()
[ -n "$max_rows" ] && rows=(--max-rows "$max_rows")
rounds=${DEMO_ROUNDS:-8}
sl=.venv/bin/sparselift
mkdir -p "$out"

echo "== 1/3 tune: $workload${max_rows:+ (rows capped at $max_rows)} on 2 ranks"
# torch's profiler prints a "USDT:" line on each rank as it starts and stops: not the demo's story
$sl tune --workload "$workload" "${rows[@]}" --nproc 2 --steps 30 --rounds "$rounds" \
  --work "$out/tune" --html "$out/tune.html" --out "$out/plan.json" \
  2> >(grep -v '^USDT:' >&2) | grep '^tune: \(iteration\|optimize: \(choices\|kept\|no splits\)\|A/B\|SparseLift\|Sparse\)'
# the names the notebooks read by default
cp "$out/plan.json" "$out/sparselift.plan.json"
cp "$out/tune/torchrec.plan.json" "$out/torchrec.plan.json"
[ -f "$out/tune/bench.json" ] && cp "$out/tune/bench.json" "$out/bench.json"
rm -rf "$out/profile" && cp -r "$(ls -d "$out"/tune/profile* | grep -E "/profile[0-9]+$" | sort -V | tail -n 1)" "$out/profile"
echo "== 2/3 analyze the last profile: sparse-path graph, summary, calibration, HTML report"
$sl analyze "$out/profile" --html "$out/report.html" | sed -n '3,6p'
echo "== 3/3 compare SparseLift's plan with TorchRec's"
bench=()
[ -f "$out/bench.json" ] && bench=(--bench "$out/bench.json")
$sl plan diff "$out/sparselift.plan.json" "$out/torchrec.plan.json" "${bench[@]}" --html "$out/plans.html" | head -n 12
.venv/bin/python - "$out" <<'PY'
import json, sys
r = json.load(open(f"{sys.argv[1]}/tune/tune.json"))
if r["ratio"] is None:
    print("demo: SparseLift's plan is TorchRec's plan: kept TorchRec's plan (no measured ratio)")
elif r["shipped"] == "candidate":
    print(f"demo: SparseLift's plan measured {r['ratio']:.2f}x faster than TorchRec's "
          f"({r['confidence']:.1%} interval {r['low']:.2f}-{r['high']:.2f}, {len(r['ab_ratios'])} rounds side by side)")
else:
    print(f"demo: SparseLift's plan was not measured faster ({r['ratio']:.2f}x, {r['confidence']:.1%} interval "
          f"{r['low']:.2f}-{r['high']:.2f}): kept TorchRec's plan")
PY
echo "demo: reports in $out/tune.html, $out/report.html and $out/plans.html; notebooks in notebooks/ read $out"
