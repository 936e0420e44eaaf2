"""The optimizer: search space, incremental cost model, CP-SAT formulation, TorchRec baseline.

Entry points: `optimize.optimize()` (a plan dict from stats + calibration + topology),
`cost_model.predict_plan()` (any plan's per-rank costs and step time) and the `sparselift optimize`
command. Heavy imports (OR-Tools, pandas, TorchRec's planner) happen inside the modules that need them.
"""
