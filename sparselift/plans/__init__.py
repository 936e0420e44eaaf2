"""SparseLift plans: the file format, its validation, and the loader that turns plans into TorchRec.

Imports only the standard library, torch and torchrec — never pandas, ortools or plotting — so a
production trainer pays little to load a plan; jsonschema, where installed, explains a bad one.
torchrec is imported on first use of a TorchRec verb (`sharding_plan`, `apply`, …), so reading and
checking a plan is cheaper still. Nothing else of SparseLift is imported.

Modules: `types` (the parts of a plan), `plan` (`Plan`), `plan_dict` (to and from the file's JSON),
`digest` (the statistics digest's fields and checks), `schema` and `consistency` (the checks),
`fileio` (load / save), `to_torchrec` (TorchRec objects), `baselines` (TorchRec's plan and the
round-robin reference), `render` (text views), `errors`; for plans with splits (format 2: model
tables as virtual tables), `splits` (the data and its checks), `transform` (the batch transform),
`rewrite` (the split model), `replicated` (data-parallel parts with their table's row-wise
Adagrad), `checkpoint` (state across the split).

    plan = sparselift.plans.load("plan.json")
    model = plan.apply(model, pg=pg, device=device)   # checks the model first, then DMP
    pipeline = plan.pipeline_class()(model, optimizer, device)
    batches = plan.transform_loader(loader)   # plans with splits: ids onto the virtual tables
"""

from sparselift.plans.baselines import (
    DEVICE_PRESETS,
    from_torchrec,
    round_robin_table_wise,
    torchrec_plan,
)
from sparselift.plans.errors import PlanError, PlanWriteError
from sparselift.plans.fileio import dumps, load, loads, save
from sparselift.plans.plan import Plan
from sparselift.plans.types import (
    DEFAULT_CACHE_LOAD_FACTOR,
    FORMAT,
    VERSION,
    CommPrecision,
    PlanTopology,
    Shard,
    Split,
    TableFingerprint,
    TablePlan,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "DEFAULT_CACHE_LOAD_FACTOR",
    "DEVICE_PRESETS",
    "CommPrecision",
    "Plan",
    "PlanError",
    "PlanWriteError",
    "PlanTopology",
    "Shard",
    "Split",
    "TableFingerprint",
    "TablePlan",
    "dumps",
    "from_torchrec",
    "load",
    "loads",
    "round_robin_table_wise",
    "save",
    "torchrec_plan",
]
