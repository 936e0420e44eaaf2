"""Workload specs, synthetic batches, model builders and the sharded training harness."""

from sparselift.workloads.spec import (
    ModelSpec,
    TableSpec,
    WorkloadSpec,
    builtin_names,
    load_workload,
)

__all__ = ["ModelSpec", "TableSpec", "WorkloadSpec", "builtin_names", "load_workload"]
