"""Plans side by side in one job of a user's own trainer (`profiler.side_by_side`) on 2 gloo
ranks, and `sparselift compare FILE`'s verdict and refusals."""

from __future__ import annotations

import json
import textwrap

import pytest
from test_profiler_session import launch_user_script

from sparselift.analysis.side_by_side import compare_side_by_side

# One rank of a user's trainer that holds two DMP models of tiny: TorchRec's plan and the
# round-robin plan, each with its own pipeline and batches. "slowed" is round-robin again, each
# step 15 ms longer: a contender known to be slower.
TRAINER = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist
    from sparselift import plans
    from sparselift.errors import UnwritablePathError
    from sparselift.profiler import side_by_side
    from sparselift.workloads.batches import SyntheticBatches
    from sparselift.workloads.sharding import build_optimizer, make_pipeline, shard
    from sparselift.workloads.spec import load_workload

    out_dir, result_path, rr_plan = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank, cpu = dist.get_rank(), torch.device("cpu")
    spec = load_workload("tiny").capped(2000)

    def stepper(plan):
        torch.manual_seed(0)
        model = shard(spec, dist.GroupMember.WORLD, cpu, plan)
        pipeline = make_pipeline("base", model, build_optimizer(model), cpu)
        batches = iter(SyntheticBatches(spec, rank=rank))
        return lambda: pipeline.progress(batches)

    torchrec, rr = stepper(None), stepper(plans.load(rr_plan))

    def slowed():
        rr()
        time.sleep(0.015)

    blocked = os.path.join(out_dir, "a-file")
    os.makedirs(out_dir, exist_ok=True)
    open(blocked, "w").close()
    try:  # rank 0 cannot write there: every rank is told, none waits for it
        side_by_side(os.path.join(blocked, "ab"), {"a": torchrec, "b": rr}, rounds=1, steps=1)
        refused = None
    except UnwritablePathError as e:
        refused = str(e)
    swapped = {"b": rr, "a": torchrec} if rank == 1 else {"a": torchrec, "b": rr}
    try:  # rank 1 names its contenders in another order: every rank is told, none steps
        side_by_side(out_dir, swapped, rounds=1, steps=1)
        mismatch = None
    except ValueError as e:
        mismatch = str(e)
    got = side_by_side(out_dir, {"torchrec": torchrec, "round-robin": rr, "slowed": slowed},
                       rounds=4, steps=3, warmup=1)
    json.dump(dict(file=None if got is None else str(got), refused=refused, mismatch=mismatch),
              open(f"{result_path}.{rank}", "w"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush(); os._exit(0)
""")


@pytest.fixture(scope="module")
def side_file(tmp_path_factory):
    """The side-by-side file of one 2-rank job, and each rank's result."""
    from sparselift.cli import main

    tmp = tmp_path_factory.mktemp("sbs")
    rr = tmp / "rr.json"
    argv = ["plan", "round-robin", "--workload", "tiny", "--max-rows", "2000"]
    assert main([*argv, "--world-size", "2", "--out", str(rr)]) == 0
    results = launch_user_script(tmp, TRAINER, [str(tmp / "ab"), str(tmp / "result"), str(rr)])
    return tmp / "ab" / "side_by_side.json", results


@pytest.mark.slow
def test_plans_in_turns_in_a_users_job_give_a_paired_verdict(side_file, cli):
    path, results = side_file
    assert [r["file"] for r in results] == [str(path), None]  # rank 0 writes it
    # rank 0 could not write under a file: both ranks raised, before any step
    assert all(r["refused"] and "is not a directory" in r["refused"] for r in results)
    # rank 1 ran its contenders in another order: both ranks raised, naming it
    assert all(r["mismatch"] and "rank 1 runs (['b', 'a']" in r["mismatch"] for r in results)
    doc = json.loads(path.read_text())
    assert doc["contenders"] == ["torchrec", "round-robin", "slowed"] and doc["world_size"] == 2
    assert all(len(doc["step_s"][n]) == 4 for n in doc["contenders"])
    assert all(len(turn) == 3 for n in doc["contenders"] for turn in doc["step_s"][n])
    # the slowed contender is measured slower than the same plan unslowed, every round
    v = compare_side_by_side(path, (["round-robin"], ["slowed"]))
    assert v.paired_rounds == 4 and v.candidate_slower and v.high < 1.0
    code, out, err = cli("compare", path, "--json", path.parent / "verdict.json")
    assert code == 0 and "paired over 4 rounds" in out, out + err
    assert f"{path} [torchrec]" in out and f"{path} [round-robin]" in out
    assert json.loads((path.parent / "verdict.json").read_text())["paired_rounds"] == 4


def _doc(**over) -> dict:
    rounds = [[0.010, 0.011, 0.012]] * 3
    doc = {
        "format": "sparselift-side-by-side",
        "version": 1,
        "world_size": 2,
        "contenders": ["base", "cand"],
        "steps": 3,
        "warmup": 1,
        "step_s": {"base": rounds, "cand": [[s / 1.25 for s in r] for r in rounds]},
    }
    return {**doc, **over}


def test_the_verdict_is_the_rounds_ratio(write_json):
    path = write_json(_doc(), "ab.json")
    v = compare_side_by_side(path)
    assert v.ratio == pytest.approx(1.25) and v.low == pytest.approx(1.25)
    assert v.candidate_faster and v.paired_rounds == 3
    back = compare_side_by_side(path, (["cand"], ["base"]))
    assert back.ratio == pytest.approx(0.8) and back.candidate_slower


def test_with_two_models_of_the_baseline_the_candidate_must_beat_both(write_json, cli):
    # "base-2" landed 7 % slower in every round; "cand" beats it clearly, but "base" only in
    # some rounds: against both models of the baseline it is not measured faster
    base = [[0.0100], [0.0101], [0.0099], [0.0100], [0.0102]]
    cand = [[b[0] / r] for b, r in zip(base, [1.03, 0.98, 1.04, 0.99, 1.02], strict=True)]
    steps = {"base": base, "base-2": [[b[0] * 1.07] for b in base], "cand": cand}
    path = write_json(_doc(contenders=list(steps), step_s=steps), "ab.json")
    assert compare_side_by_side(path, (["base-2"], ["cand"])).candidate_faster
    both = compare_side_by_side(path, (["base", "base-2"], ["cand"]))
    assert not both.candidate_faster and both.low < 1.0 < both.ratio
    code, out, _ = cli("compare", path, "--names", "base,base-2", "cand")
    assert code == 0 and f"{path} [base, base-2]" in out and "keep the baseline" in out, out


@pytest.mark.parametrize(
    "over, args, want",
    [
        ({"format": "x"}, [], "not a side-by-side file"),
        ({"contenders": ["base"]}, [], "contenders must be a list of 2 or more distinct names"),
        ({"contenders": ["base", "base"]}, [], "2 or more distinct names"),
        ({"contenders": ["base", "other"]}, [], "step_s must hold the step times"),
        ({"step_s": {"base": [[0.01]] * 3, "cand": [[-0.01]] * 3}}, [], "step_s.cand must be"),
        ({"step_s": {"base": [[0.01]] * 3, "cand": [[]] * 3}}, [], "step_s.cand must be"),
        ({"step_s": {"base": [[0.01]] * 3, "cand": [[0.01]] * 4}}, [], "different numbers of"),
        ({"step_s": {"base": [[0.01]] * 2, "cand": [[0.01]] * 2}}, [], "needs at least 3"),
        ({}, ["--names", "base", "nope"], "no contender named 'nope'"),
        ({}, ["--names", "base", "base"], "'base' is both a baseline and a candidate"),
        ({}, ["--names", ",", "cand"], "name at least one contender for the baseline"),
        ({}, ["--also", "p1", "p2"], "--also pairs separate jobs' profiles"),
    ],
)
def test_a_bad_side_by_side_file_is_refused_in_one_line(write_json, cli, over, args, want):
    path = write_json(_doc(**over), "ab.json")
    code, out, err = cli("compare", path, *args)
    assert code == 2 and want in err and len(err.strip().splitlines()) == 1, err


def test_the_directory_given_to_side_by_side_is_read_and_a_profile_alone_refused(tmp_path, cli):
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "side_by_side.json").write_text(json.dumps(_doc()))
    code, out, _ = cli("compare", tmp_path / "ab")
    assert code == 0 and "measured ratio 1.250x" in out, out
    (tmp_path / "prof").mkdir()
    (tmp_path / "prof" / "manifest.json").write_text("{}")
    code, _, err = cli("compare", tmp_path / "prof")
    assert code == 2 and "compare takes two profiles, or one side-by-side file" in err, err


def test_names_with_two_profiles_are_refused(tmp_path, cli):
    code, _, err = cli("compare", tmp_path, tmp_path, "--names", "a", "b")
    assert code == 2 and "--names picks contenders of a side-by-side file" in err, err
