"""More bad input, found by probing every command: one line naming the bad thing, exit 2, no file.

The cases of `test_bad_input.py` cover the flags and the files' outer shape; these cover what
failed with a traceback or was accepted before: a profile manifest whose keys have the wrong
shape (read by analyze, compare, plan check and optimize alike), an unreadable access_stats.parquet
or a missing manifest under `optimize --profile`, topology and calibration files with NaN,
infinite or negative numbers, optimize flags that were silently ignored or overflowed the solver,
tune arguments its later steps refused only after TorchRec's planner ran, and outputs in a folder
no file can be created in (/proc), refused before any other output is written.

Every refusal comes before any rank starts, so none of these cases trains. A case is one line:
`id | argv | needle`; `{name}` is a file or folder `inputs` made.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pandas as pd
import pytest
from bad_input_cases import FIXTURES, analyzed_fixture_profile, assert_refused, expand, rows
from plans_helpers import round_robin

from sparselift import plans
from sparselift.workloads import load_workload

NOPROC = not Path("/proc/self").is_dir()  # /proc: a folder where no file can be created

# manifest.json variants: name → (key, value); each folder also holds the profile's calibration
# and access statistics, so that every command gets as far as the manifest
MANIFESTS = {
    "m_batch": ("batch_size", "x"),
    "m_files": ("files", "x"),
    "m_sharding": ("sharding", ["x"]),
    "m_shard_sizes": ("sharding", [{"table": "t0", "shards": [{"rank": 0, "sizes": True}]}]),
    "m_shard_rank": (
        "sharding",
        [{"table": "t0", "shards": [{"rank": 5, "offsets": [0, 0], "sizes": [9, 4]}]}],
    ),
    "m_tables": ("tables", ["x"]),
    "m_missing": ("missing_ranks", [7]),
    "m_steps": ("step_times_s", "x"),
}
MACROS = {
    "$OPT": "optimize --no-baseline --time-limit 1",  # no waiting on TorchRec
    "$BASE": "optimize --workload tiny --time-limit 1 --out {tmp}/p.json",  # with TorchRec's
    "$W": "--workload tiny",
    "$P": "--out {tmp}/p.json",
    "$TUNE": "tune --workload tiny --out {tmp}/p.json",
    "$RR": "plan round-robin --world-size 2 --out {tmp}/p.json --workload",
    "$FIN": "must be a finite number >= 0",
    "$SEED": "--seed must be in 0..2,147,483,647",
    "$CAL": "--calibration is for --workload",
    "$ACCESS": "access_stats.parquet: unreadable Parquet",
    "$BWD": "op 'lookup_bwd':",
    "$FWD": "op 'output_dist_fwd':",
}

MANIFEST_CASES = """
m_batch | 'batch_size' must be an integer >= 1, got 'x'
m_files | 'files' must be an object, got 'x'
m_sharding | 'sharding' must be a list of objects
m_shard_sizes | 'sharding' must be a list of objects, each with a string 'table', 'ranks'
m_shard_rank | 'sharding' names rank 5, not a rank of world_size 2
m_tables | 'tables' must be a list of objects, each with a string 'name'
m_missing | 'missing_ranks' names rank 7, not a rank of world_size 2
m_steps | 'step_times_s' must be a list (per rank) of lists of finite numbers"""
MANIFEST_COMMANDS = {
    "analyze": "analyze {dir} --out {tmp}/o",
    "compare": "compare {prof} {dir}",
    "check": "plan check {digest} --profile {dir} --time-limit 1",
    "optimize": "$OPT --profile {dir} $P",
}

CASES = """
optimize-profile-no-manifest | $OPT --profile {nomanifest} $P | {nomanifest}/manifest.json: missing
optimize-profile-bad-access | $OPT --profile {badaccess} $P | {badaccess}/$ACCESS
check-profile-bad-access | plan check {digest} --profile {badaccess} | {badaccess}/$ACCESS
optimize-profile-infinite-zipf | $OPT --profile {infzipf} $P | 'zipf_alpha' of table 't1' holds inf
check-profile-negative-ids | plan check {digest} --profile {negids} | 'ids' of table 't0' holds -5

topology-nan | $OPT $W --topology {topo_nan} $P | {topo_nan}: intra_host_bw $FIN, got nan
topology-inf | $OPT $W --topology {topo_inf} $P | {topo_inf}: intra_host_bw $FIN, got inf
topology-negative-latency | $OPT $W --topology {topo_lat} $P | {topo_lat}: collective_latency_s $FIN
topology-negative-memory | $OPT $W --topology {topo_ddr} $P | {topo_ddr}: ddr_bytes $FIN
topology-huge-world | $OPT $W --topology {topo_world} $P | {topo_world}: world_size 1,000,000,000 is
topology-preset-not-string | $OPT $W --topology {topo_preset} $P | {topo_preset}: 'preset' must be

calibration-nan-slope | $OPT $W --calibration {cal_nan} $P | {cal_nan}: op 'input_dist': b_s must be
calibration-negative-dense | $OPT $W --calibration {cal_dense} $P | {cal_dense}: dense_step_s $FIN
calibration-nan-per-type | $OPT $W --calibration {cal_type} $P | {cal_type}: type_overhead_s $FIN
calibration-zero-world | $OPT $W --calibration {cal_world} $P | {cal_world}: world_size must be at
calibration-infinite-sync | $OPT $W --calibration {cal_sync} $P | {cal_sync}: $BWD sync_s $FIN
calibration-year-long-call | $OPT $W --calibration {cal_year} $P | {cal_year}: $FWD a_s must be sec
calibration-infinite-weight | $OPT $W --calibration {cal_winf} $P | {cal_winf}: $BWD bag_weight must
calibration-huge-weight | $OPT --profile {cal_huge} $P | the coefficients price lookup_bwd at up to

optimize-seed-huge | $OPT $W --seed 99999999999 $P | $SEED
optimize-seed-negative | $OPT $W --seed -1 $P | $SEED
optimize-calibration-with-profile | $OPT --profile {prof} --calibration {cal_world} $P | $CAL
optimize-max-rows-with-profile | $OPT --profile {prof} --max-rows 10 $P | --max-rows is for
optimize-split-margin-negative | $OPT $W --split-margin -0.1 $P | --split-margin must be a finite
optimize-baseline-out-is-out | $BASE --baseline-out {tmp}/p.json | {tmp}/p.json is also --out

plan-validate-other-world | plan validate {rr4} --world-size 2 | {rr4}: plan is for world_size 4

spec-feature-twice-in-a-table | $RR {featwice} | table 't3': feature 'a' is listed twice
spec-feature-of-two-tables | $RR {feattwo} | table 't3': feature 't2' already feeds table 't2'

tune-baseline-missing | $TUNE --baseline {tmp}/nope.json | {tmp}/nope.json: cannot read the plan
tune-baseline-malformed | $TUNE --baseline {malformed} | {malformed}: malformed JSON
tune-baseline-other-world | $TUNE --baseline {rr4} | {rr4}: plan is for world_size 4, this job has 2
tune-rounds-zero | $TUNE --rounds 0 | --rounds must be in 1..
tune-more-rounds-negative | $TUNE --more-rounds -1 | --more-rounds must be in 0..
tune-profile-steps-zero | $TUNE --profile-steps 0 | --profile-steps must be in 1..
tune-after-negative | $TUNE --after -1 | --after must be in 0..
tune-time-limit-nan | $TUNE --time-limit nan | --time-limit must be a finite number > 0, got nan
tune-work-is-file | $TUNE --work {malformed} | --work {malformed}: not a directory
tune-work-under-file | $TUNE --work {malformed}/w | --work {malformed}/w: cannot create it
"""

# outputs in /proc: the folder exists, but no file can be created there
PROC_CASES = """
analyze-html-in-proc | analyze {prof} --out {tmp}/o --html /proc/r.html | cannot write /proc/r.html
optimize-baseline-out-in-proc | $BASE --baseline-out /proc/b.json | cannot write /proc/b.json
optimize-out-in-proc | $OPT $W --out /proc/p.json | cannot write /proc/p.json
compare-json-in-proc | compare {prof} {prof} --json /proc/v.json | cannot write /proc/v.json
tune-html-in-proc | $TUNE --html /proc/t.html | cannot write /proc/t.html
tune-work-in-proc | $TUNE --work /proc/w | --work /proc/w: cannot create it
"""


def _cases() -> list:
    out = []
    for name, needle in rows(MANIFEST_CASES):
        for command, argv in MANIFEST_COMMANDS.items():
            case = (argv.replace("{dir}", "{" + name + "}"), f"{{{name}}}/manifest.json: {needle}")
            out.append(pytest.param(*case, id=f"{command}-manifest-{MANIFESTS[name][0]}"))
    out += [pytest.param(argv, needle, id=i) for i, argv, needle in rows(CASES)]
    skip = pytest.mark.skipif(NOPROC, reason="no /proc here")
    out += [pytest.param(a, n, id=i, marks=skip) for i, a, n in rows(PROC_CASES)]
    return out


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory) -> dict[str, Path]:
    """A real profile (tests/fixtures) analyzed, and a plan optimized from it (with a digest)."""
    from sparselift.cli import main

    root = tmp_path_factory.mktemp("bad_input_more")
    prof = analyzed_fixture_profile(root)
    digest = root / "digest.json"
    argv = [*MACROS["$OPT"].split(), "--profile", str(prof), "--out", str(digest)]
    assert main(argv) == 0
    return {"prof": prof, "digest": digest}


@pytest.fixture
def inputs(tmp_path, analyzed) -> dict[str, Path]:
    """The files and folders the cases name, made in `tmp_path`."""
    prof = analyzed["prof"]
    paths = {"tmp": tmp_path, **analyzed}
    manifest = json.loads((prof / "manifest.json").read_text())
    calibration = json.loads((prof / "calibration.json").read_text())

    def folder(name: str, files: dict[str, str | bytes]) -> None:
        d = tmp_path / name
        d.mkdir()
        for f, content in files.items():
            (d / f).write_bytes(content if isinstance(content, bytes) else content.encode())
        paths[name] = d

    def put(name: str, obj: object) -> None:
        p = tmp_path / f"{name}.json"
        p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        paths[name] = p

    access = (prof / "access_stats.parquet").read_bytes()
    profile_files = {"calibration.json": json.dumps(calibration), "access_stats.parquet": access}
    for name, (key, value) in MANIFESTS.items():
        folder(name, {**profile_files, "manifest.json": json.dumps({**manifest, key: value})})
    folder("nomanifest", profile_files)
    bad_access = {"access_stats.parquet": b"garbage", "manifest.json": json.dumps(manifest)}
    folder("badaccess", {**profile_files, **bad_access})
    for name, column, table, value in (
        ("infzipf", "zipf_alpha", "t1", math.inf),
        ("negids", "ids", "t0", -5),
    ):
        stats = pd.read_parquet(prof / "access_stats.parquet")
        stats.loc[stats["table"] == table, column] = value
        folder(name, {**profile_files, "manifest.json": json.dumps(manifest)})
        stats.to_parquet(paths[name] / "access_stats.parquet")

    topology = {"format": "sparselift-topology", "version": 1, "world_size": 2, "device": "cpu"}
    put("topo_nan", {**topology, "intra_host_bw": math.nan})
    put("topo_inf", {**topology, "intra_host_bw": math.inf})
    put("topo_lat", {**topology, "collective_latency_s": -1.0})
    put("topo_ddr", {**topology, "ddr_bytes": -5})
    put("topo_world", {**topology, "world_size": 10**9})
    put("topo_preset", {**topology, "preset": 3})

    ops = calibration["ops"]
    put(
        "cal_nan",
        {**calibration, "ops": {**ops, "input_dist": {**ops["input_dist"], "b_s": math.nan}}},
    )
    put("cal_dense", {**calibration, "dense_step_s": -1.0})
    put("cal_type", {**calibration, "type_overhead_s": math.nan})
    put("cal_world", {**calibration, "world_size": 0})

    def with_op(kind: str, **fields: float) -> dict:
        return {**calibration, "ops": {**ops, kind: {**ops[kind], **fields}}}

    put("cal_sync", with_op("lookup_bwd", sync_s=math.inf))
    put("cal_year", with_op("output_dist_fwd", a_s=3.2e7))
    put("cal_winf", with_op("lookup_bwd", bag_weight=math.inf))
    # finite, but it prices a lookup past what the solver's 64-bit nanoseconds hold
    folder("cal_huge", {**profile_files, "manifest.json": json.dumps(manifest)})
    huge = with_op("lookup_bwd", bag_weight=1e15)
    (paths["cal_huge"] / "calibration.json").write_text(json.dumps(huge))

    plans.save(round_robin(4), tmp_path / "rr4.json")
    paths["rr4"] = tmp_path / "rr4.json"
    put("malformed", '{"format": "sparselift-plan", ')
    spec = load_workload("tiny").to_dict()
    spec["tables"][3]["feature_names"] = ["a", "a"]
    put("featwice", spec)
    spec["tables"][3]["feature_names"] = ["t2"]
    put("feattwo", spec)
    return paths


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("argv, needle", _cases())
def test_refused_in_one_line_exit_2_and_nothing_written(argv, needle, inputs, cli):
    args, needle = shlex.split(expand(argv, MACROS, inputs)), expand(needle, MACROS, inputs)
    before, profile_before = _tree(inputs["tmp"]), _tree(inputs["prof"])
    code, _, err = cli(*args)
    assert_refused(code, err, needle)
    assert _tree(inputs["tmp"]) == before, "a refused command left or changed files"
    assert _tree(inputs["prof"]) == profile_before, "a refused command wrote into the profile"


def test_the_shape_checks_pass_every_manifest_the_profiler_wrote():
    """The fixtures' manifests (written by `sparselift profile`) pass `read_manifest` as they are:
    the checks refuse only what the profiler never writes."""
    from sparselift.profile_manifest import read_manifest

    for d in sorted(FIXTURES.glob("profile_*")):
        m = read_manifest(d)
        assert m["world_size"] == len(m["files"]["traces"]), d
