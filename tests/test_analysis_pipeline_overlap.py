"""The sparse-dist pipeline's overlap, fitted from profiles of one plan under each pipeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparselift.analysis.pipeline import analyze
from sparselift.analysis.pipeline_overlap import BASE, SPARSE_DIST, fit_pipeline_overlap
from sparselift.errors import UserError

FIX = Path(__file__).parent / "fixtures" / "profile_tiny_table_wise"


@pytest.fixture(scope="module")
def critical_path():
    return analyze(FIX, cache=False).critical_path


def _profile(tmp_path: Path, name: str, pipeline: str, step_s: float) -> Path:
    """The fixture profile under `pipeline`, every step taking `step_s` on every rank."""
    d = tmp_path / name
    shutil.copytree(FIX, d)
    m = json.loads((d / "manifest.json").read_text())
    m["pipeline"] = pipeline
    m["step_times_s"] = [[step_s] * len(r) for r in m["step_times_s"]]
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_the_overlap_is_the_step_saved_plus_the_overhead_over_input_dist(tmp_path, critical_path):
    input_dist = critical_path[critical_path["kind"] == "input_dist"].groupby("step")["total_s"]
    x = float(input_dist.sum().median())
    base = _profile(tmp_path, "b", BASE, 0.020)
    sd = _profile(tmp_path, "s", SPARSE_DIST, 0.020 - 0.4 * x)  # saves 40 % of input_dist ...
    fit = fit_pipeline_overlap(base, critical_path, sd, overhead_s=0.1 * x)  # ... net of 10 %
    assert fit.overlap == pytest.approx(0.5) and fit.input_dist_s == pytest.approx(x)
    slower = _profile(tmp_path, "s2", SPARSE_DIST, 0.030)
    worse = fit_pipeline_overlap(base, critical_path, slower, overhead_s=0.0)
    assert worse.share == pytest.approx(-0.010 / x) and worse.overlap == 0.0


def test_profiles_that_are_not_one_plan_under_both_pipelines_are_refused(tmp_path, critical_path):
    base = _profile(tmp_path, "b", BASE, 0.02)
    with pytest.raises(UserError, match="need a TrainPipelineBase profile"):
        fit_pipeline_overlap(base, critical_path, _profile(tmp_path, "c", BASE, 0.02), 0.0)
    other = _profile(tmp_path, "o", SPARSE_DIST, 0.02)
    m = json.loads((other / "manifest.json").read_text())
    m["sharding"][0]["ranks"] = [1 - m["sharding"][0]["ranks"][0]]
    (other / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="different plans"):
        fit_pipeline_overlap(base, critical_path, other, 0.0)


def test_a_saving_within_the_noise_is_not_counted_on(tmp_path, critical_path):
    input_dist = critical_path[critical_path["kind"] == "input_dist"].groupby("step")["total_s"]
    x = float(input_dist.sum().median())

    def noisy(name: str, pipeline: str, steps: list[float]) -> Path:
        d = _profile(tmp_path, name, pipeline, 0.0)
        m = json.loads((d / "manifest.json").read_text())
        m["step_times_s"] = [list(steps) for _ in m["step_times_s"]]
        (d / "manifest.json").write_text(json.dumps(m))
        return d

    # warm-up steps, then the six profiled ones (the fixture times none after the window)
    window = [1.0, 1.6, 0.7, 1.4, 0.8, 1.2]  # median 1.1
    base = noisy("b", BASE, [0.02 * j for j in [1, 1, 1, *window]])
    sd = noisy("s", SPARSE_DIST, [(0.02 - 0.3 * x) * j for j in [1, 1, 1, *reversed(window)]])
    fit = fit_pipeline_overlap(base, critical_path, sd, overhead_s=0.0)
    # the medians say the pipeline saves 33 % of input_dist; the noise says it may save nothing
    assert fit.share == pytest.approx(0.3 * 1.1)
    assert fit.share_low < 0 and fit.overlap == 0.0
