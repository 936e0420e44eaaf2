"""SparseLift plans: the file format, its validation, and the loader that turns a plan into TorchRec.

Imports only the standard library, torch and torchrec — never pandas, ortools or plotting — so a
production trainer pays milliseconds to load a plan; jsonschema, where installed, explains a bad one.
torchrec is imported on first use of a TorchRec verb (`sharding_plan`, `apply`, …), so reading and
checking a plan is cheaper still.

    plan = sparselift.plans.load("plan.json")
    model = plan.apply(model, pg=pg, device=device)   # checks the model first, then DMP
    pipeline = plan.pipeline_class()(model, optimizer, device)
"""

from sparselift.plans.baselines import (
    DEVICE_PRESETS,
    from_torchrec,
    round_robin_table_wise,
    torchrec_plan,
)
from sparselift.plans.errors import PlanError
from sparselift.plans.fileio import dumps, load, loads, save
from sparselift.plans.plan import (
    DEFAULT_CACHE_LOAD_FACTOR,
    FORMAT,
    VERSION,
    CommPrecision,
    Plan,
    PlanTopology,
    Shard,
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
    "PlanTopology",
    "Shard",
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
