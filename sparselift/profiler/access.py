"""Capture the KJTs each sharded embedding module receives, during the profiled window only.

The capture wraps the module's `input_dist` (an instance attribute over the bound method, removed
after the window): both TorchRec's plain forward (`ShardedModule.forward` → `input_dist`) and the
sparse-dist pipeline (which calls `module.input_dist` directly, one batch ahead) go through it,
whereas a forward pre-hook sees only the placeholder arguments of the pipelined forward. Only
references are kept while training; statistics are computed after the window
(`access_stats.py`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sparselift.errors import UserError


class NoShardedEmbeddingError(UserError):
    """The model given to the profiler has no TorchRec sharded embedding module."""


@dataclass(frozen=True)
class TableMeta:
    """One embedding table as the sharded module declares it."""

    name: str
    num_embeddings: int
    embedding_dim: int
    features: tuple[str, ...]
    pooling_type: str  # SUM / MEAN for bags, NONE for sequence embeddings
    module: str  # path of the sharded module inside the model
    # a FeatureProcessedEmbeddingBagCollection's table: its feature processors (e.g. position
    # weights) read the model's own features, so no split can rename them
    feature_processed: bool = False
    data_type: str = "fp32"  # its weights' TorchRec DataType, lower case


@dataclass
class Capture:
    """One KJT as a sharded module received it."""

    step: int
    module: str
    kjt: Any  # torchrec KeyedJaggedTensor


def _configs(module: nn.Module) -> list[Any] | None:
    for attr in ("_embedding_bag_configs", "_embedding_configs"):
        cfgs = getattr(module, attr, None)
        if cfgs:
            return list(cfgs)
    return None


def model_device(model: nn.Module) -> torch.device:
    """The device a (DMP) model runs on: its `device`, else its first parameter's, else CPU."""
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def find_sharded_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost TorchRec sharded embedding modules in `model`, with their paths.

    Raises:
        NoShardedEmbeddingError: there is none (the model is not DMP-sharded).
    """
    from torchrec.distributed.types import ShardedModule

    found: list[tuple[str, nn.Module]] = []
    for path, m in model.named_modules():
        if isinstance(m, ShardedModule) and _configs(m) is not None and hasattr(m, "input_dist"):
            if not any(path.startswith(p + ".") for p, _ in found):
                found.append((path, m))
    if not found:
        raise NoShardedEmbeddingError(
            f"the profiler needs a model sharded by TorchRec (DistributedModelParallel) with at "
            f"least one sharded embedding module (ShardedEmbeddingBagCollection or "
            f"ShardedEmbeddingCollection); {type(model).__name__} has none"
        )
    return found


def clean_path(path: str) -> str:
    """The module path as written in DMP's sharding plan (without DMP / DDP wrapper prefixes)."""
    for prefix in ("_dmp_wrapped_module.", "module."):
        if path.startswith(prefix):
            path = path[len(prefix) :]
    return path


def feature_processed_paths(model: nn.Module) -> set[str]:
    """The paths (as `clean_path` writes them) of the collections that sharded
    FeatureProcessedEmbeddingBagCollections hold."""
    from torchrec.distributed.fp_embeddingbag import ShardedFeatureProcessedEmbeddingBagCollection

    return {
        clean_path(f"{path}._embedding_bag_collection" if path else "_embedding_bag_collection")
        for path, m in model.named_modules()
        if isinstance(m, ShardedFeatureProcessedEmbeddingBagCollection)
    }


def table_metas(
    modules: list[tuple[str, nn.Module]], processed: set[str] | None = None
) -> list[TableMeta]:
    """Every table the sharded `modules` declare, in module then table order (those at a path
    in `processed`, `feature_processed_paths`, marked feature-processed)."""
    metas = []
    for path, m in modules:
        for c in _configs(m) or []:
            pooling = getattr(c, "pooling", None)
            metas.append(
                TableMeta(
                    name=c.name,
                    num_embeddings=int(c.num_embeddings),
                    embedding_dim=int(c.embedding_dim),
                    features=tuple(c.feature_names),
                    pooling_type=getattr(pooling, "name", "NONE"),
                    module=clean_path(path),
                    feature_processed=clean_path(path) in (processed or set()),
                    data_type=getattr(getattr(c, "data_type", None), "name", "FP32").lower(),
                )
            )
    return metas


def warn_duplicate_tables(metas: list[TableMeta]) -> None:
    """Warn (once per name) of a table name that several collections use: the profile is still
    written, but analysis and planning keep statistics per table name and will refuse it."""
    modules: dict[str, list[str]] = {}
    for m in metas:
        modules.setdefault(m.name, []).append(repr(m.module))
    for name, where in modules.items():
        if len(where) > 1:
            warnings.warn(
                f"sparselift profiler: table {name!r} is in {len(where)} collections "
                f"({', '.join(where)}); the profile is written, but `sparselift analyze` and "
                "`optimize` will refuse it: rename all but one",
                RuntimeWarning,
                stacklevel=3,
            )


def _find_kjt(args: tuple, kwargs: dict) -> Any:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    for a in (*args, *kwargs.values()):
        if isinstance(a, KeyedJaggedTensor):
            return a
    return None


@dataclass
class AccessRecorder:
    """Wraps `input_dist` of each sharded module while attached; `step` labels what it sees."""

    modules: list[tuple[str, nn.Module]]
    step: int | None = None
    captures: list[Capture] = field(default_factory=list)
    _attached: bool = False

    def attach(self) -> None:
        """Wrap every module's `input_dist`; what they receive is captured while `step` is set."""
        for path, m in self.modules:
            m.input_dist = self._wrap(path, m.input_dist)
        self._attached = True

    def detach(self) -> None:
        """Remove the wrappers: the class's input_dist is what runs afterwards."""
        if not self._attached:
            return
        for _, m in self.modules:
            m.__dict__.pop("input_dist", None)
        self._attached = False

    def _wrap(self, path: str, original: Any) -> Any:
        def input_dist(*args: Any, **kwargs: Any) -> Any:
            if self.step is not None:
                kjt = _find_kjt(args, kwargs)
                if kjt is not None:
                    self.captures.append(Capture(self.step, path, kjt))
            return original(*args, **kwargs)

        return input_dist
