"""Analysis: Kineto traces → DataFrames → sparse-path subgraphs, step summary, cost calibration.

Each module does one job and is a set of functions over pandas DataFrames (HTA style):
`trace` (one parse per trace, cached as Parquet), `profile` (the profile directory and its checks),
`names` (TorchRec's record_function names, matched tolerantly), `reconstruct` (nodes, edges,
cross-rank collectives), `summary`, `calibration` (fit + calibration.json; a plan's step time
is predicted from it by the optimizer's cost model, `sparselift.optimizer.cost_model.predict_plan`),
`pipeline` (the front door: `analyze()` → `Analysis`, `write_outputs`).
"""
