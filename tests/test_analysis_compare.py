"""`sparselift compare`: a measured verdict on two real profiles, and refusals of different jobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparselift.analysis.compare import compare_jobs, compare_profiles, job_models, spanning

FIX = Path(__file__).parent / "fixtures"


def _profile(
    tmp_path: Path, name: str, scale: float = 1.0, after: list[float] | None = None
) -> Path:
    """A copy of the table-wise fixture profile with `after` steps added, all its steps scaled."""
    d = tmp_path / name
    shutil.copytree(FIX / "profile_tiny_table_wise", d)
    m = json.loads((d / "manifest.json").read_text())
    m["step_times_s"] = [[t * scale for t in r + list(after or [])] for r in m["step_times_s"]]
    (d / "manifest.json").write_text(json.dumps(m))
    return d


STEADY = [0.0100, 0.0102, 0.0098, 0.0101, 0.0099, 0.0100]  # seconds, after the window


def test_a_candidate_measured_faster_slower_or_alike(tmp_path):
    base = _profile(tmp_path, "base", after=STEADY)
    faster = compare_profiles(base, _profile(tmp_path, "fast", 0.8, after=STEADY))
    assert faster.candidate_faster and faster.ratio == pytest.approx(1.25)
    assert 1.0 < faster.low <= faster.ratio <= faster.high
    slower = compare_profiles(base, _profile(tmp_path, "slow", 1.25, after=STEADY))
    assert slower.candidate_slower and not slower.candidate_faster
    same = compare_profiles(base, _profile(tmp_path, "same", after=STEADY))
    assert not same.candidate_faster and not same.candidate_slower and same.ratio == 1.0


def test_a_gain_within_the_noise_is_not_called_faster(tmp_path):
    # the profiled window's six steps range 10-17 ms: 3 % faster is not a measured gain
    v = compare_profiles(_profile(tmp_path, "a"), _profile(tmp_path, "b", 0.97))
    assert v.ratio > 1.0 and v.low < 1.0 and not v.candidate_faster


def test_steady_steps_after_the_window_are_compared_not_the_profiled_ones(tmp_path):
    # the window's steps say the candidate is slower; the steps after it say it is faster
    base = _profile(tmp_path, "base", 1.0, after=[0.010] * 6)
    cand = _profile(tmp_path, "cand", 1.0, after=[0.008, 0.0081, 0.0079, 0.008, 0.0082, 0.0078])
    m = json.loads((cand / "manifest.json").read_text())
    w = m["warmup"] + len(m["profiled_steps"])
    m["step_times_s"] = [
        [t * (2.0 if i < w else 1.0) for i, t in enumerate(r)] for r in m["step_times_s"]
    ]
    (cand / "manifest.json").write_text(json.dumps(m))
    v = compare_profiles(base, cand)
    assert v.baseline.where == v.candidate.where == "after the window"
    assert v.candidate_faster and v.ratio == pytest.approx(0.010 / 0.008)


def _side_by_side(d: Path, job: str, turns: list[list[float]]) -> Path:
    """`d` as a profile of side-by-side job `job` whose steady steps are `turns`."""
    m = json.loads((d / "manifest.json").read_text())
    m.update(
        side_by_side_job=job,
        steady_turn_steps=len(turns[0]),
        steady_step_s=[t for turn in turns for t in turn],
    )
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_profiles_of_one_side_by_side_job_are_compared_round_by_round(tmp_path):
    # the host's speed drifts 1.35x between rounds; in every round the candidate is 3 % faster
    drift = [1.0, 1.3, 0.95, 1.2, 1.1, 0.97, 1.25, 1.05]
    base_turns = [[0.0100 * f, 0.0101 * f] for f in drift]
    cand_turns = [[t / 1.03 for t in turn] for turn in base_turns]
    base = _side_by_side(_profile(tmp_path, "base"), "job1", base_turns)
    cand = _side_by_side(_profile(tmp_path, "cand"), "job1", cand_turns)
    v = compare_profiles(base, cand)
    assert v.paired_rounds == len(drift) and v.candidate_faster
    assert v.ratio == pytest.approx(1.03) and "paired over 8 rounds" in v.summary()
    # the same steps from two jobs of their own cannot be paired: the drift swamps the 3 %
    other = _side_by_side(_profile(tmp_path, "other"), "job2", cand_turns)
    u = compare_profiles(base, other)
    assert u.paired_rounds == 0 and u.low < 1.0 < u.high and not u.candidate_faster


def test_a_candidate_is_faster_only_than_every_model_of_the_baseline(tmp_path):
    # one job, the baseline plan as two models: model 1 landed 7 % slow in every round, model 2
    # steps as the candidate does; against model 1 alone the candidate measures faster
    rounds = [1.0, 1.1, 0.97, 1.05, 1.02, 0.99]
    even = [[0.0100 * f, 0.0101 * f] for f in rounds]
    slow = [[t * 1.07 for t in turn] for turn in even]
    cand = _side_by_side(_profile(tmp_path, "cand"), "job1", [[t * 1.001 for t in u] for u in even])
    m1 = _side_by_side(_profile(tmp_path, "model1"), "job1", slow)
    m2 = _side_by_side(_profile(tmp_path, "model2"), "job1", even)
    other = _side_by_side(_profile(tmp_path, "other"), "job2", slow)
    assert compare_profiles(m1, cand).candidate_faster
    assert job_models(cand, [str(other), str(m1), str(m2)]) == [str(m1), str(m2)]
    both = spanning([compare_profiles(m, cand) for m in (m1, m2)])
    assert both.ratio == compare_profiles(m1, cand).ratio and not both.candidate_faster
    assert both.low < 1.0 < 1.06 < both.high


def test_the_verdict_repeats_exactly(tmp_path):
    base, cand = _profile(tmp_path, "a"), _profile(tmp_path, "b", 0.97)
    assert compare_profiles(base, cand) == compare_profiles(base, cand)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda m: m.update(batch_size=512), "batch_size 256 vs 512"),
        (lambda m: m["tables"].pop(), "table 't7' is in only one of them"),
        (lambda m: m["tables"][2].update(num_embeddings=7), "table 't2'"),
    ],
)
def test_profiles_of_different_jobs_are_refused_in_one_line(tmp_path, cli, change, needle):
    base, other = _profile(tmp_path, "base"), _profile(tmp_path, "other")
    m = json.loads((other / "manifest.json").read_text())
    change(m)
    (other / "manifest.json").write_text(json.dumps(m))
    out = tmp_path / "v.json"
    code, _, err = cli("compare", base, other, "--json", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and not out.exists()
    assert str(base) in lines[0] and str(other) in lines[0] and needle in lines[0]


def test_cli_prints_the_verdict_and_writes_json(tmp_path, cli):
    out = tmp_path / "v.json"
    a, b = _profile(tmp_path, "a", after=STEADY), _profile(tmp_path, "b", 0.8, after=STEADY)
    code, stdout, _ = cli("compare", a, b, "--json", out)
    assert code == 0 and "the candidate is measured faster" in stdout
    rec = json.loads(out.read_text())
    assert rec["format"] == "sparselift-compare" and rec["candidate_faster"] is True


def test_pairs_of_separate_jobs_are_compared_pair_by_pair(tmp_path, cli):
    # each pair of jobs ran at its own host speed (0.8-1.4x); within a pair the candidate is
    # 10 % faster every time: measured faster over the pairs, though the jobs spread widely
    pairs = [
        (
            _profile(tmp_path, f"b{i}", s, after=STEADY),
            _profile(tmp_path, f"c{i}", s / 1.1, after=STEADY),
        )
        for i, s in enumerate((1.0, 1.4, 0.8, 1.2))
    ]
    v = compare_jobs(pairs)
    assert v.paired_jobs == 4 and v.ratio == pytest.approx(1.1) and v.candidate_faster
    # the same steps, the candidates' jobs shuffled against the baselines': no gain measured
    shifted = [*pairs[1:], pairs[0]]
    mixed = [(b, c) for (b, _), (_, c) in zip(pairs, shifted, strict=True)]
    assert not compare_jobs(mixed).candidate_faster
    code, out, _ = cli("compare", *pairs[0], *(x for p in pairs[1:] for x in ("--also", *p)))
    assert code == 0 and "paired over 4 pairs of jobs" in out
    assert sum(line.startswith("baseline ") for line in out.splitlines()) == 4
    code, out, err = cli("compare", *pairs[0], "--also", *pairs[1])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "2 pair(s) of jobs: an interval over jobs needs at least 3" in err
