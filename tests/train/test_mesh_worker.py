"""The training worker as the backends launch it (WORKER_MODULE: train.distributed.worker + Pipes): spec parsing, and a real run
that reports through Dagster Pipes (file-based context and messages, as a launcher would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster_pipes import encode_param
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.orchestration.training_backends import WORKER_MODULE
from marin_assets.train.distributed.worker import EXIT_BAD_SPEC
from marin_assets.train.spec import TrainSpec, load_spec
from tests.support.configs import TINY_TRAIN

spec_from_dict = TrainSpec.from_json_dict

ROOT = Path(__file__).resolve().parents[2]


def good_spec(caches, out_dir) -> dict:
    return {
        "config": TINY_TRAIN,
        "caches": {k: str(v) for k, v in caches.items()},
        "out_dir": str(out_dir),
        "resume": True,
        "warm_start": None,
    }


def test_spec_round_trips_and_names_bad_fields(tmp_path):
    spec = spec_from_dict(good_spec({"web": "/c"}, tmp_path))
    assert spec.config.num_steps == TINY_TRAIN["num_steps"] and spec.resume is True
    assert spec_from_dict(spec.to_json_dict()) == spec
    cases = {
        "missing key(s) ['resume']": {k: v for k, v in good_spec({"w": "/c"}, tmp_path).items() if k != "resume"},
        "unknown key(s) ['resum']": dict(good_spec({"w": "/c"}, tmp_path), resum=True),
        "spec.resume must be true or false": dict(good_spec({"w": "/c"}, tmp_path), resume="yes"),
        "spec.caches is empty": dict(good_spec({}, tmp_path)),
        "spec.config: unknown field(s) ['batch_sise']": dict(
            good_spec({"w": "/c"}, tmp_path), config=dict(TINY_TRAIN, batch_sise=3)
        ),
        "spec.warm_start must be a non-empty string or null": dict(good_spec({"w": "/c"}, tmp_path), warm_start=3),
    }
    for message, data in cases.items():
        with pytest.raises(ValueError) as err:
            spec_from_dict(data)
        assert message in str(err.value), (message, str(err.value))


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["config", "caches", "out_dir", "resume", "warm_start", "x"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.text(max_size=3),
            st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
        ),
    )
)
def test_spec_parser_never_crashes_on_junk(data):
    try:
        spec_from_dict(data)
    except ValueError as e:
        assert str(e).startswith("spec")
    except TypeError as e:  # a config field of the wrong type reaches a dataclass
        raise AssertionError(f"unhelpful error for {data}: {e}") from None


def _worker(spec_path: Path, extra_env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "DAGSTER_PIPES", "MARIN_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **extra_env)
    return subprocess.run(
        [sys.executable, "-m", WORKER_MODULE, "--spec", str(spec_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_spec_loads_from_an_fsspec_url(tmp_path):
    import fsspec

    with fsspec.open("memory://h9/spec.json", "w") as f:
        f.write(json.dumps(good_spec({"w": "/c"}, tmp_path)))
    assert load_spec("memory://h9/spec.json").caches == {"w": "/c"}
    with pytest.raises(ValueError, match="memory://h9/none.json: spec file not found"):
        load_spec("memory://h9/none.json")


def test_bad_spec_file_exits_2(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text("{not json")
    proc = _worker(path, {}, timeout=120)
    assert proc.returncode == EXIT_BAD_SPEC
    assert f"bad spec: {path}: not valid JSON" in proc.stderr


@pytest.mark.slow
def test_worker_trains_and_reports_through_pipes(caches, tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(good_spec(caches, tmp_path / "out")))
    messages = tmp_path / "messages.jsonl"
    context = {
        "asset_keys": ["train/tiny"],
        "code_version_by_asset_key": None,
        "provenance_by_asset_key": None,
        "partition_key": None,
        "partition_key_range": None,
        "partition_time_window": None,
        "run_id": "r1",
        "job_name": "j",
        "retry_number": 0,
        "extras": {},
    }
    proc = _worker(
        spec_path,
        {
            "DAGSTER_PIPES_CONTEXT": encode_param({"data": context}),
            "DAGSTER_PIPES_MESSAGES": encode_param({"path": str(messages)}),
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sent = [json.loads(line) for line in messages.read_text().splitlines()]
    methods = [m["method"] for m in sent]
    assert methods[0] == "opened" and methods[-1] == "closed"
    rows = [m["params"]["payload"]["metrics"] for m in sent if m["method"] == "report_custom_message"]
    assert [r["step"] for r in rows] == list(range(1, TINY_TRAIN["num_steps"] + 1))
    logs = [m["params"]["message"] for m in sent if m["method"] == "log"]
    assert any("training main: 12 steps on mesh {'data': 1, 'sequence': 1, 'expert': 1}" in line for line in logs)
    (mat,) = [m["params"] for m in sent if m["method"] == "report_asset_materialization"]
    assert mat["asset_key"] == "train/tiny"
    meta = {k: v["raw_value"] for k, v in mat["metadata"].items()}
    assert meta["final_step"] == TINY_TRAIN["num_steps"]
    assert meta["tokens"] == TINY_TRAIN["num_steps"] * TINY_TRAIN["batch_size"] * TINY_TRAIN["seq_len"]
    assert meta["phase_start_step"] == 0 and set(meta["tokens_left"]) == set(caches)
    assert meta["last_loss"] == pytest.approx(rows[-1]["loss"])
    assert meta["mesh"] == {"data": 1, "sequence": 1, "expert": 1} and meta["devices"] == 1
    assert set(meta["counts"]) >= {"skipped_nonfinite", "skipped_spike"}
    assert (tmp_path / "out" / "train_result.json").exists()


def test_spec_carries_the_telemetry_run_and_checks_it():
    from marin_assets.train.config import TrainConfig, config_to_dict

    data = {
        "config": config_to_dict(TrainConfig()),
        "caches": "c",
        "out_dir": "o",
        "resume": True,
        "telemetry_run": "demo-phoenix",
    }
    spec = spec_from_dict(data)
    assert (spec.telemetry_run, spec.telemetry_root, spec.warm_start) == ("demo-phoenix", None, None)
    assert spec_from_dict(spec.to_json_dict()) == spec
    with pytest.raises(ValueError, match="spec.telemetry_run must be a non-empty string or null"):
        spec_from_dict({**data, "telemetry_run": 5})
    with pytest.raises(ValueError, match="spec.telemetry_run: invalid run name 'a/b'"):
        spec_from_dict({**data, "telemetry_run": "a/b"})


def test_one_spec_class_for_the_orchestrator_and_the_worker(tmp_path):
    """What a backend builds (Paths and all) is what the worker reads back from the JSON."""
    from marin_assets.orchestration import training_backends
    from marin_assets.train.config import config_from_dict

    assert training_backends.TrainSpec is TrainSpec
    built = TrainSpec(
        config_from_dict(TINY_TRAIN),
        {"web": tmp_path / "web"},
        tmp_path / "out",
        warm_start=tmp_path / "prev",
        telemetry_run="demo-kestrel",
    )
    assert built.caches == {"web": str(tmp_path / "web")} and built.out_dir == str(tmp_path / "out")
    assert built.warm_start == str(tmp_path / "prev") and built.resume is True
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(built.to_json_dict()))
    assert load_spec(path) == built
    assert built.paths() == [str(tmp_path / "out"), str(tmp_path / "web"), str(tmp_path / "prev")]
    for bad, message in [
        ({"caches": {"web": 3}}, "spec.caches['web'] must be a non-empty path string, got 3"),
        ({"caches": ""}, "spec.caches (a mapping or one path) must be a non-empty path string"),
        ({"out_dir": None}, "spec.out_dir must be a non-empty path string, got None"),
        ({"config": {"num_steps": 3}}, "spec.config must be a TrainConfig, got dict"),
    ]:
        args = {"config": built.config, "caches": "c", "out_dir": "o", **bad}
        with pytest.raises(ValueError) as err:
            TrainSpec(**args)
        assert message in str(err.value), (message, str(err.value))
