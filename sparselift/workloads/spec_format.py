"""The workload-spec format for people: what `sparselift workloads --format` prints.

The text is docs/WORKLOADS.md, kept here (a test checks that the two are the same) so that an
installed package can print it, with every limit filled in from `spec.py`: the page cannot drift
from what the code accepts.
"""

from __future__ import annotations

from sparselift.workloads import spec

_TEXT = """\
# Workload specs

A workload spec is a JSON file that describes the sparse side of a recommendation model and how it
is fed: enough to build the model, generate realistic synthetic batches, and plan it for any
topology. Every command that takes `--workload` accepts the path of such a file or the name of a
built-in one: {builtins}.

SparseLift may add optional keys to the format, and keeps reading files written like these; keys
it does not know are ignored. Integers must be JSON integers (`1000`, not `1000.0` or `"1000"`),
never `true` or `false`; numbers must be finite (no `NaN`, no `Infinity`). A spec that breaks a
rule below is refused in one line that names the file and the table, before anything runs.

## The workload

- `name` (string, not empty; required): a short identifier.
- `description` (string; default `""`): free text.
- `batch_size` (integer, 1..{max_batch}; required): samples per rank per step.
- `dense_in_features` (integer, 1..{max_features}; required): the number of dense (float)
  features.
- `model` (object; required): the dense side, below.
- `tables` (list of objects, not empty; required): the embedding tables, below.

## `model`

- `arch` (one of {archs}; required):
  `dlrm` is TorchRec's DLRM (dot interaction); `dlrm-dcn` is DLRM with a DCNv2 interaction;
  `concat-mlp` concatenates the pooled embeddings with the dense tower's output into an MLP, for
  tables of mixed dims; it is the one arch that takes sequence tables (each sequence feature's
  embeddings averaged per sample).
- `dense_arch` (non-empty list of integers, each 1..{max_features}; required): layer sizes of the
  dense tower. For `dlrm` and `dlrm-dcn` the last one must equal every table's `embedding_dim`.
- `over_arch` (non-empty list of integers, each 1..{max_features}; required): layer sizes of the
  over arch; the last must be 1 (one logit); `dlrm` and `dlrm-dcn` need at least 2 (TorchRec's
  OverArch).
- `interaction` (string; default `dcn` for `dlrm-dcn`, else `dot`): recorded only; `arch` decides
  the interaction.
- `dcn_num_layers` (integer, 1..{max_dcn_layers}; default 3): DCNv2 layers, for `dlrm-dcn`.
- `dcn_low_rank_dim` (integer, 1..{max_features}; default 512): DCNv2 low-rank size, for
  `dlrm-dcn`.

## Each table

- `name` (string, not empty, unique; required): the table's name; its feature is named after it
  unless `feature_names` is given.
- `num_embeddings` (integer, 1..{max_rows}; required): rows.
- `embedding_dim` (integer, a multiple of 4 in 4..{max_dim}; required): columns
  (FBGEMM's kernels, which TorchRec shards tables with, need a multiple of 4).
- `pooling_factor` (number, 1..{max_pooling}; default 1): mean ids per sample for each of the
  table's features; an integer with `fixed` pooling.
- `pooling` (one of {poolings}; default `fixed`):
  `fixed` is exactly `pooling_factor` ids per sample; `poisson` is 1 + Poisson(`pooling_factor` - 1)
  ids per sample: mean `pooling_factor`, at least 1.
- `zipf_alpha` (number, 0..{max_alpha:g}; default 0): skew of id popularity. 0 is uniform; about 1
  is typical of production features.
- `feature_names` (non-empty list of non-empty strings; default `[name]`): the sparse features
  that look this table up. A feature feeds one table only.
- `sequence` (`true` or `false`; default `false`): a sequence table, kept in an
  EmbeddingCollection (one embedding per id, as a user's history in a sequence model) rather than
  the EmbeddingBagCollection that pools each feature's ids; `concat-mlp` only. TorchRec shards it
  table-, column-, row-wise or data-parallel, and SparseLift never splits it. The model keeps
  one EmbeddingCollection per sequence dim (TorchRec's holds tables of one dim).
- `data_type` (one of `fp32`, `fp16`; default `fp32`): the type of the table's weights, which
  its memory is counted in (the optimizer state stays one fp32 value per row).

The limits are far beyond today's models ({max_rows_short} rows, {max_dim_short} columns per
table): they keep every byte and id count SparseLift derives within a 64-bit integer, so that a
typo such as `100000000000000000000` rows is refused at load instead of failing in a later stage.

`--max-rows R` (train, profile, bench, optimize, plan) caps every table at R rows by hashing ids
into the first R, the way a capped production table does.

## Built-in workloads

- `tiny`: eight small tables; seconds per run on 2 CPU ranks.
- `criteo-kaggle`: the Criteo Kaggle cardinalities, 33.8 M rows; a run on a small machine needs
  rows capped (`--max-rows`).
- `multihot-26`: the same cardinalities fed multi-hot (MLPerf DLRM-DCNv2's ids-per-sample sizes,
  214 lookups per sample): the sparse path dominates the step.

`sparselift workloads` lists them; their files, `sparselift/workloads/builtin/*.json`, are a good
start for a spec of your own.
"""


def _code_list(values: tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def spec_format() -> str:
    """The workload-spec format as Markdown (docs/WORKLOADS.md), limits from `spec.py`."""
    return _TEXT.format(
        builtins=_code_list(tuple(spec.builtin_names())),
        archs=_code_list(spec.ARCHS),
        poolings=_code_list(spec.POOLINGS),
        max_batch=spec.format_limit(spec.MAX_BATCH_SIZE),
        max_features=spec.format_limit(spec.MAX_FEATURES),
        max_dcn_layers=spec.format_limit(spec.MAX_DCN_LAYERS),
        max_rows=spec.format_limit(spec.MAX_NUM_EMBEDDINGS),
        max_rows_short=f"2^{spec.MAX_NUM_EMBEDDINGS.bit_length() - 1}",
        max_dim=spec.format_limit(spec.MAX_EMBEDDING_DIM),
        max_dim_short=f"2^{spec.MAX_EMBEDDING_DIM.bit_length() - 1}",
        max_pooling=spec.format_limit(spec.MAX_POOLING_FACTOR),
        max_alpha=spec.MAX_ZIPF_ALPHA,
    )
