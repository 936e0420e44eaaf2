"""The optimizer: which option each table runs with and where its shards go, to minimize the step.

Entry points: `optimize.optimize()` (a plan from statistics, coefficients and a topology),
`predict.predict_plan()` (any plan's per-rank costs and step time) and the `sparselift optimize`
command. Inside, one module per job:

- `table_stats`, `topology`, `calibration`: the inputs (tables, hardware, coefficients);
- `space`: the options (classes, choices, plan-wide decisions); `feasibility`: which fit;
- `counts` → `cost_model`: resource counts, then their price (terms, rank loads, plan cost);
- `problem` (the problem and its term table) → `formulation` (the CP-SAT models) → `solver`
  (build, solve, read out; the mode) with `placement` (greedy LPT and local search);
- `planio`: choices ↔ plan files; `torchrec_baseline` / `torchrec_referee`: TorchRec's planner
  and its estimator's verdict; `synthetic`: table sets for benchmarks and tests.

Heavy imports (OR-Tools, pandas, TorchRec's planner) happen inside the modules that need them.
"""
