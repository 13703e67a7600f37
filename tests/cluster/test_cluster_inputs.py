"""Bad fleet/jobs files and flags: every number bounded, every error one clear line, fast."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marin_assets.cli import main
from marin_assets.cli.cluster import container_command
from marin_assets.cluster.fleet import MAX_DOMAINS, fleet_from_dict, load_structured
from marin_assets.cluster.simulate import MAX_TIME_S, jobs_from_dict

POOL = {"name": "gb200", "accelerator": "gb200-nvl72", "region": "us-central1", "domains": 2}
JOB = {"id": "j1", "submit_s": 0, "duration_s": 100, "accelerator": "gb200-nvl72", "chips": 8}


def _files(tmp_path, pools=None, jobs=None, failures=None):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"pools": pools or [POOL]}))
    stream = tmp_path / "jobs.yaml"
    data = {"jobs": jobs or [JOB]}
    if failures is not None:
        data["failures"] = failures
    stream.write_text(yaml.safe_dump(data))
    return str(fleet), str(stream)


def _simulate(capsys, fleet, jobs, *flags):
    rc = main(["cluster", "simulate", "--fleet", fleet, "--jobs", jobs, "--json", *flags])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("submit_s", math.nan, "submit_s must be a finite number, got nan"),
        ("submit_s", math.inf, "submit_s must be a finite number, got inf"),
        ("submit_s", -1, "submit_s must be in [0, 3.16224e+07], got -1"),
        ("submit_s", 1e12, "submit_s must be in [0, 3.16224e+07], got 1e+12"),
        ("submit_s", "10", "submit_s must be a number, got '10'"),
        ("submit_s", True, "submit_s must be a number, got True"),
        ("duration_s", math.nan, "duration_s must be a finite number"),
        ("duration_s", 0, "duration_s must be in (0, 3.16224e+07], got 0"),
        ("duration_s", 1e300, "duration_s must be in (0, 3.16224e+07], got 1e+300"),
        ("checkpoint_interval_s", math.nan, "checkpoint_interval_s must be a finite number"),
        ("checkpoint_interval_s", -5, "checkpoint_interval_s must be in (0,"),
    ],
)
def test_bad_job_numbers_are_refused_naming_record_and_field(tmp_path, capsys, field, value, needle):
    fleet, jobs = _files(tmp_path, jobs=[{**JOB, field: value}])
    rc, out, err = _simulate(capsys, fleet, jobs)
    assert (rc, out) == (2, "")
    assert f"jobs.yaml: jobs[0]: job 'j1': {needle}" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "failure, needle",
    [
        ({"at_s": math.nan, "pool": "gb200", "domain": 0, "down_s": 60}, "at_s must be a finite number"),
        ({"at_s": 10, "pool": "gb200", "domain": 0, "down_s": math.inf}, "down_s must be a finite number"),
        ({"at_s": 10, "pool": "gb200", "domain": 0.5, "down_s": 60}, "domain must be an integer, got 0.5"),
        ({"at_s": 10, "pool": "gb200", "domain": 0}, "missing field(s) ['down_s']"),
        ({"at_s": 10, "pool": "gb200", "domain": 0, "down_s": 60, "when": 1}, "unknown fields ['when']"),
        ({"at_s": 10, "pool": "gb200\n", "domain": 0, "down_s": 60}, "pool 'gb200\\n' is not a valid name"),
    ],
)
def test_bad_failure_records_are_refused(tmp_path, capsys, failure, needle):
    fleet, jobs = _files(tmp_path, failures=[failure])
    rc, _, err = _simulate(capsys, fleet, jobs)
    assert rc == 2 and "failures[0]" in err and needle in err


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("domains", 10**10, f"domains must be in [1, {MAX_DOMAINS}], got 10000000000"),
        ("domains", True, "domains must be an integer, got True"),
        ("domains", 2.0, "domains must be an integer, got 2.0"),
        ("domain_chips", 10**9, "domain_chips must be in [0, 1000000]"),
        ("chips_per_host", "4", "chips_per_host must be an integer, got '4'"),
        ("ep_domain_chips", math.nan, "ep_domain_chips must be an integer, got nan"),
        ("whole_domain", "yes", "whole_domain must be true or false"),
    ],
)
def test_bad_pool_numbers_are_refused_naming_the_field(tmp_path, capsys, field, value, needle):
    fleet, jobs = _files(tmp_path, pools=[{**POOL, field: value}])
    rc, _, err = _simulate(capsys, fleet, jobs)
    assert rc == 2 and "fleet.yaml: pools[0]: pool 'gb200':" in err and needle in err


def test_tpu_topology_too_large_and_fleet_too_large_are_refused():
    tpu = {"name": "v5p", "accelerator": "tpu-v5p", "region": "us-east5", "domains": 1, "topology": "999x999x999"}
    with pytest.raises(ValueError, match="topology 999x999x999 has 997002999 chips, more than 1000000"):
        fleet_from_dict({"pools": [tpu]})
    pools = [{**POOL, "name": f"p{i}", "domains": MAX_DOMAINS} for i in range(11)]
    with pytest.raises(ValueError, match="1100000 domains in all, more than the limit of 1000000"):
        fleet_from_dict({"pools": pools})
    assert len(fleet_from_dict({"pools": pools[:10]}).pools) == 10  # just inside the limit


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--tick-s", "nan"], "argument --tick-s: 'nan' is not a finite number"),
        (["--tick-s", "inf"], "argument --tick-s: 'inf' is not a finite number"),
        (["--heartbeat-s=-inf"], "argument --heartbeat-s: '-inf' is not a finite number"),
        (["--horizon-s", "nan"], "argument --horizon-s: 'nan' is not a finite number"),
    ],
)
def test_non_finite_flags_are_refused_by_name(tmp_path, capsys, flags, needle):
    fleet, jobs = _files(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["cluster", "simulate", "--fleet", fleet, "--jobs", jobs, *flags])
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--tick-s", "0"], "tick_s must be in [0.001, 86400], got 0"),
        (["--tick-s", "10", "--heartbeat-s", "5"], "heartbeat_s must be in [10, 86400], got 5"),
        (["--tick-s", "10", "--heartbeat-s", "25"], "heartbeat_s (25) must be a whole multiple of tick_s (10)"),
        (["--tick-s", "0.1", "--heartbeat-s", "0.3"], "could take 2.59e+07 ticks of tick_s=0.1s"),
        (["--horizon-s", "1e12"], "horizon_s must be in [0, 6.32448e+07], got 1e+12"),
    ],
)
def test_periods_and_tick_budget_are_checked_before_the_replay(tmp_path, capsys, flags, needle):
    fleet, jobs = _files(tmp_path)
    rc, _, err = _simulate(capsys, fleet, jobs, *flags)
    assert rc == 2 and needle in err


def test_fractional_ticks_heartbeat_and_finish_within_a_horizon(tmp_path, capsys):
    """0.1 s ticks and 0.3 s heartbeats: counted in whole ticks, so heartbeats happen
    (before: float remainders never hit 0, nothing was ever placed)."""
    fleet, jobs = _files(tmp_path)
    rc, out, _ = _simulate(capsys, fleet, jobs, "--tick-s", "0.1", "--heartbeat-s", "0.3", "--horizon-s", "200")
    report = json.loads(out)
    assert rc == 0 and report["completed"] == 1 and report["queue_wait_s"]["p50"] <= 0.3
    assert report["heartbeats"] == report["ticks"] // 3 + 1


@pytest.mark.parametrize(
    "name, text, needle",
    [
        (
            "jobs.yaml",
            "jobs:\n  - {id: j1, submit_s: 0\n  - oops: [\n",
            "jobs.yaml:3:9: invalid YAML: expected ',' or '}', but got ':'",
        ),
        ("jobs.yaml", "jobs: [\n", "jobs.yaml:2:1: invalid YAML:"),
        ("jobs.yaml", "jobs: !!python/object:os.system x\n", "jobs.yaml:1:7: invalid YAML: could not determine a constructor"),
        ("jobs.json", '{"jobs": [1,}', "jobs.json:1:13: invalid JSON: Expecting value"),
        ("jobs.yaml", "[" * 3000, "jobs.yaml: nested too deeply"),
    ],
)
def test_malformed_files_give_one_line_with_file_and_line(tmp_path, capsys, name, text, needle):
    fleet, _ = _files(tmp_path)
    path = tmp_path / name
    path.write_text(text)
    rc, _, err = _simulate(capsys, fleet, str(path))
    assert rc == 2 and needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_non_utf8_file_is_one_line(tmp_path, capsys):
    fleet, _ = _files(tmp_path)
    path = tmp_path / "jobs.yaml"
    path.write_bytes(b"jobs: \xff\xfe\n")
    rc, _, err = _simulate(capsys, fleet, str(path))
    assert rc == 2 and "jobs.yaml: not UTF-8 text (byte 6)" in err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--load", "nan"], "argument --load: 'nan' is not a finite number"),
    ],
)
def test_gen_jobs_flags_non_finite(tmp_path, capsys, argv, needle):
    fleet, _ = _files(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["cluster", "gen-jobs", "--fleet", fleet, *argv])
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["-n", str(10**9)], "n (number of jobs) must be in [1, 1000000], got 1000000000"),
        (["--load", "1"], "load must be below 1"),
        (["--load", "0"], "load must be in (0, 1], got 0"),
    ],
)
def test_gen_jobs_bounds(tmp_path, capsys, argv, needle):
    fleet, _ = _files(tmp_path)
    assert main(["cluster", "gen-jobs", "--fleet", fleet, *argv]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, command",
    [
        (["--", "python", "-m", "train"], ["python", "-m", "train"]),
        (["python", "-m", "train"], ["python", "-m", "train"]),
        (["--", "--", "x"], ["--", "x"]),  # only the separator goes; a literal "--" after it stays
    ],
)
def test_manifest_strips_the_separator_before_the_command(capsys, argv, command):
    from pathlib import Path

    fleet = str(Path(__file__).parents[2] / "examples" / "fleet.yaml")
    assert (
        main(["cluster", "manifest", "--fleet", fleet, "--pool", "v5e-256", "--name", "llama", "--image", "marin:1", *argv]) == 0
    )
    job = list(yaml.safe_load_all(capsys.readouterr().out))[1]
    containers = job["spec"]["template"]["spec"]["containers"]
    assert [c["command"] for c in containers] == [command]
    assert container_command(argv) == command


def test_manifest_unknown_pool_is_one_plain_line(capsys):
    from pathlib import Path

    fleet = str(Path(__file__).parents[2] / "examples" / "fleet.yaml")
    assert (
        main(["cluster", "manifest", "--fleet", fleet, "--pool", "nope", "--name", "llama", "--image", "marin:1", "--", "python"])
        == 2
    )
    # Not KeyError's repr ("\"no pool named 'nope'\""), and it says which pools there are.
    assert capsys.readouterr().err == (
        "marin cluster manifest: no pool named 'nope' (pools: gb200, v5e-256, v5p-512, v4-2048, cpu)\n"
    )


# ---- property tests: arbitrary values never raise anything but a clear ValueError --------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
_PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _pool_records():
    return st.fixed_dictionaries(
        {
            "name": st.sampled_from(["gb200", "v5e", "cpu", "Bad Name", "a\n"]),
            "accelerator": st.sampled_from(["gb200-nvl72", "tpu-v5e", "cpu", "h100x8", "tpu-v9"]),
            "region": st.sampled_from(["us-central1", "us-west4", "nowhere"]),
        },
        optional={
            "domains": _scalars,
            "domain_chips": _scalars,
            "chips_per_host": _scalars,
            "topology": st.one_of(_scalars, st.sampled_from(["4x4", "16x16", "2x2x2"])),
            "ep_domain_chips": _scalars,
            "whole_domain": _scalars,
        },
    )


def _job_records():
    return st.fixed_dictionaries(
        {"id": st.one_of(st.sampled_from(["j1", "j2"]), _scalars)},
        optional={
            "submit_s": _scalars,
            "duration_s": _scalars,
            "checkpoint_interval_s": _scalars,
            "accelerator": st.one_of(st.just("gb200-nvl72"), _scalars),
            "chips": _scalars,
            "priority": st.one_of(st.just("batch"), _scalars),
            "region": _scalars,
        },
    )


@_PROPERTY
@given(st.one_of(_values, st.fixed_dictionaries({"pools": st.lists(st.one_of(_pool_records(), _values), max_size=3)})))
def test_fleet_parser_accepts_only_bounded_values_and_otherwise_says_why(data):
    try:
        fleet = fleet_from_dict(data, source="fleet.yaml")
    except ValueError as err:
        assert str(err).startswith("fleet.yaml") and "\n" not in str(err)
        return
    for pool in fleet.pools:
        assert type(pool.domains) is int and 1 <= pool.domains <= MAX_DOMAINS
        assert type(pool.domain_chips) is int and 1 <= pool.domain_chips <= 1_000_000
        assert pool.domain_chips % pool.chips_per_host == 0


@_PROPERTY
@given(
    st.one_of(
        _values,
        st.fixed_dictionaries(
            {"jobs": st.lists(st.one_of(_job_records(), _values), max_size=3)},
            optional={
                "failures": st.one_of(
                    _values,
                    st.lists(
                        st.fixed_dictionaries({"at_s": _scalars, "pool": _scalars, "domain": _scalars, "down_s": _scalars}),
                        max_size=2,
                    ),
                )
            },
        ),
    )
)
def test_jobs_parser_accepts_only_bounded_values_and_otherwise_says_why(data):
    try:
        jobs, failures = jobs_from_dict(data, source="jobs.yaml")
    except ValueError as err:
        assert str(err).startswith("jobs.yaml")
        return
    for job in jobs:
        assert math.isfinite(job.submit_s) and 0 <= job.submit_s <= MAX_TIME_S
        assert math.isfinite(job.duration_s) and 0 < job.duration_s <= MAX_TIME_S
    for failure in failures:
        assert math.isfinite(failure.at_s) and math.isfinite(failure.down_s) and failure.down_s > 0


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["x.yaml", "x.json"]))
def test_loader_turns_any_bytes_into_data_or_one_valueerror_line(tmp_path_factory, blob, name):
    path = tmp_path_factory.mktemp("load") / name
    path.write_bytes(blob)
    try:
        load_structured(path)
    except ValueError as err:
        assert str(err).startswith(str(path)) and "\n" not in str(err)
