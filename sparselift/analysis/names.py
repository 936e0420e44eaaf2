"""TorchRec / PyTorch event names, matched tolerantly (case, spacing and suffixes vary by version).

Everything that depends on how a TorchRec release spells its `record_function` annotations lives
here, so that a new spelling is one regex, not a hunt through the analysis.
"""

from __future__ import annotations

import re

SPARSE_STAGES = ("input_dist", "lookup", "output_dist")  # the sparse path's stages, in order
STEP = re.compile(r"^ProfilerStep#(\d+)$")
# the sparse-dist pipeline's input distribution on the main thread (train_pipelines.py,
# runtime_forwards.py; `## start_sparse_data_dist 3 ##`)
PIPELINE_INPUT_DIST = re.compile(
    r"^## (start_sparse_data_dist|wait_sparse_data_dist|runtime_forward_assemble_KJT)\b"
)
# `[lookup]_[model.sparse_arch.ebc]_[table_wise]`, `[output_dist]_[...]_[...]`, `[splits_dist]_...`
TAGGED = re.compile(
    r"^\[(?P<stage>[a-z_]+)\]_\[(?P<module>[^\]]*)\](?:_\[(?P<sharding>[a-z_]+)\])?"
)

# stage of an event by its own name; the outermost match on the call stack wins
_STAGE_RULES: list[tuple[str, re.Pattern]] = [
    ("input_dist", re.compile(r"^\[(splits_dist|input_dist|input_dist_wait|kjt_dist)\]", re.I)),
    ("lookup", re.compile(r"^\[lookup\]", re.I)),
    ("output_dist", re.compile(r"^\[(output_dist)\]", re.I)),
    # `[output_dist_wait]` appears both under input-dist awaitables and after lookups: weak, by
    # context
    (
        "output_dist",
        re.compile(
            r"^\[output_dist_wait\]|EmbeddingBagCollectionAwaitable|PooledEmbeddingsAwaitable"
            r"|EmbeddingCollectionAwaitable",
            re.I,
        ),
    ),
    (
        "input_dist",
        re.compile(
            r"KJTList\w*Awaitable|KJTAllToAll|SplitsAllToAll|all2all_data:|dist_init:recat"
            r"|KJTOneToAll|bucketize",
            re.I,
        ),
    ),
    (
        "output_dist",
        re.compile(
            r"all2all_?pooled|alltoall_?pooled|reduce_?scatter|ReduceScatter|all_?gather_?(v|base)?_(fwd|bwd)"
            r"|AllGather\w*(Req|Wait)|all2all_seq|alltoall_seq|variable_batch_all2all",
            re.I,
        ),
    ),
    (
        "lookup",
        re.compile(
            r"Split(NoBag)?LookupFunction|split_embedding_(nobag_)?(backward_)?codegen"
            r"|split_embedding\w*lookup"
            r"|fbgemm::(dense|split)_embedding|TBE|IntNBitTableBatched",
            re.I,
        ),
    ),
]
# KJT permutes in a forward outside any stage are the EBC's input distribution
INPUT_PERMUTE = re.compile(
    r"fbgemm::(permute_2D_sparse_data|permute_1D_sparse_data|permute_sparse_data"
    r"|block_bucketize_sparse_features)",
    re.I,
)
BACKWARD = re.compile(
    r"^## backward ##$|autograd::engine::evaluate_function|Backward\d*\b|Backward$"
    r"|CppNode<|_bwd\b",
    re.I,
)
FORWARD_BLOCK = re.compile(r"^## forward ##$", re.I)
# a thread blocked on someone else: its self time is waiting when a collective is in flight
WAIT = re.compile(r"wait|Req(Backward)?$|synchroniz|barrier", re.I)
# launches of collectives on the main thread
C10D = re.compile(r"^(c10d::|record_param_comms|nccl:|gloo:)", re.I)
# collectives as executed (gloo worker threads, NCCL kernels)
COLLECTIVE = re.compile(r"^gloo:|nccl(Dev)?Kernel|^nccl:", re.I)
TBE_FWD = re.compile(
    r"fbgemm::split_embedding_codegen_lookup\w*function|fbgemm::\w*embedding\w*forward", re.I
)
BOUNDS_CHECK = re.compile(r"fbgemm::bounds_check_indices", re.I)
# the dense TBE (data-parallel tables): no bounds check runs before it, so its own indices count
DENSE_TBE_FWD = re.compile(r"fbgemm::dense_embedding_codegen_lookup_function", re.I)
# a TBE's autograd node in the backward: its sequence number may be its forward op's plus one
TBE_BWD_NODE = re.compile(r"CppNode<.*SplitLookupFunction", re.I)


def stage_of(name: str) -> str | None:
    """input_dist | lookup | output_dist for a sparse-path name, else None."""
    for stage, rx in _STAGE_RULES:
        if rx.search(name):
            return stage
    return None


def collective_op(name: str) -> str:
    """Canonical collective name of an event: all_to_all, all_reduce, reduce_scatter, all_gather,
    broadcast, barrier, send, recv, or "other"."""
    n = name.lower().replace("alltoall", "all_to_all").replace("allreduce", "all_reduce")
    n = (
        n.replace("reducescatter", "reduce_scatter")
        .replace("allgather", "all_gather")
        .replace("sendrecv", "all_to_all")
    )
    for op in (
        "all_to_all",
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "barrier",
        "send",
        "recv",
    ):
        if op in n:
            return op
    return "other"


DTYPE_BYTES = {
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "double": 8,
    "long int": 8,
    "int": 4,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
}
