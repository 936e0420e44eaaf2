"""Analysis: Kineto traces → DataFrames → sparse-path graph, step summary, cost calibration.

Each module does one job, mostly as functions over pandas DataFrames (HTA style). The front door
is `pipeline` (`analyze()` → `Analysis`, `write_outputs`). In the order the work flows:

- `profile`: the profile directory and its checks; `trace`: one parse per trace, cached as Parquet;
  `names`: TorchRec's record_function names, matched tolerantly.
- `stack` (the main thread's call stack and self time), `collectives` (collectives as executed,
  paired with their launches and across ranks), `reconstruct` (nodes per rank and step),
  `edges`: the graph.
- `summary`: where each rank's step went, the critical sparse path.
- `samples` (per-call sizes and times), `volumes` (bytes per rank from the plan), `fit` (the
  `sparselift.calibration.Calibration` written as calibration.json).
- `findings`, `tables`, `plots`, `views`, `report`: what people read (CLI, notebooks, HTML).
"""
