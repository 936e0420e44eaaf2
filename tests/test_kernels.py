"""The lookup-work unit: distinct rows expected under Zipf match a recount of generated ids."""

from __future__ import annotations

import pytest
import torch

from sparselift.kernels import expected_unique, lookup_work
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.topology import preset
from sparselift.workloads.batches import zipf_ranks


@pytest.mark.parametrize(
    "rows, alpha, draws",
    [
        (1000, 1.05, 100_000),
        (100_000, 1.05, 100_000),
        (1_000_000, 0.9, 50_000),
        (300, 0.0, 512),
        (80_000, 1.3, 10_000),
    ],
)
def test_expected_unique_matches_a_recount(rows, alpha, draws):
    g = torch.Generator().manual_seed(1)
    counted = zipf_ranks(draws, rows, alpha, g).unique().numel()
    assert expected_unique(rows, alpha, draws) == pytest.approx(counted, rel=0.1)


def test_units_by_device():
    # GPU: elements moved — ids read, rows gathered (32 lanes at least), bags written — and rows
    # narrower than a warp's 128 elements move less per pass
    assert lookup_work("lookup_bwd", "cuda", 100, 10, 128, bag_elems=1280) == 100 * 130 + 1280
    assert lookup_work("lookup_bwd", "cuda", 100, 10, 64, bag_elems=640) == pytest.approx(
        1.15 * (100 * 66 + 640)
    )
    assert lookup_work("lookup_bwd", "cuda", 100, 10, 8) == lookup_work(
        "lookup_bwd", "cuda", 100, 10, 32
    )
    assert lookup_work("lookup_bwd", "cuda", 100, 10, 32) == pytest.approx(1.75 * 100 * 34)
    # CPU: per id and distinct row whatever the dim; pooled outputs add a little
    assert (
        lookup_work("lookup_bwd", "cpu", 100, 10, 64)
        == lookup_work("lookup_bwd", "cpu", 100, 10, 8)
        > 100
    )
    assert lookup_work("lookup_fwd", "cpu", 100, 10, 64, bag_elems=640) > lookup_work(
        "lookup_fwd", "cpu", 100, 10, 64
    )


def test_a_lookup_fit_in_another_unit_is_not_used():
    topo = preset("cpu-gloo", 2)
    cal = {
        "device": "cpu",
        "ops": {
            "lookup_bwd": {"x": "ids*dim", "a_s": 1.0, "b_s": 1.0},
            "input_dist": {"x": "bytes", "a_s": 0.5, "b_s": 1e-9},
        },
    }
    k = coefficients(topo, cal)
    assert k.lookup_bwd == coefficients(topo).lookup_bwd  # the preset's, not the stale fit
    assert k.input_dist.a_s == 0.5
