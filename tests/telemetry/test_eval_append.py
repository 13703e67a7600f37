"""Evaluation scores land in the telemetry store next to the training run's steps."""

import pytest

from marin_assets.evaluation.run import telemetry_metrics
from marin_assets.telemetry import TelemetryStore
from tests.support.configs import EVAL_CHECKPOINT


def test_telemetry_metrics_flattens_bpb_and_accuracies():
    result = {
        "step": 3,
        "phase": "p",
        "bpb": {"micro_bpb": 1.5, "macro_bpb": 1.25, "sets": {"web": {"bpb": 1.0}, "code": {"bpb": 1.5}}},
        "multiple_choice": {"arc_easy": {"acc": 0.5, "acc_norm": 0.25, "n": 8, "chance": 0.25}},
    }
    assert telemetry_metrics(result) == {
        "eval.bpb.micro": 1.5,
        "eval.bpb.macro": 1.25,
        "eval.bpb.web": 1.0,
        "eval.bpb.code": 1.5,
        "eval.acc.arc_easy": 0.5,
        "eval.acc_norm.arc_easy": 0.25,
    }
    assert telemetry_metrics({"step": 1, "phase": None}) == {}


@pytest.fixture
def checkpoint(tmp_path):
    import jax

    from marin_assets.model import init_params, init_router_bias
    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict, config_to_dict

    config = config_from_dict(EVAL_CHECKPOINT)
    state = {"params": init_params(config.model, jax.random.PRNGKey(0)), "router_bias": init_router_bias(config.model)}

    def save(folder, meta):
        ckpt.save(folder / "checkpoints", 10, state, {"config": config_to_dict(config), "phase": "phoenix", **meta})
        return folder

    return save


def test_evaluate_appends_at_the_checkpoint_step_under_the_training_run(checkpoint, tmp_path):
    from marin_assets.evaluation import evaluate

    root = str(tmp_path / "telemetry")
    named = checkpoint(tmp_path / "named", {"telemetry_run": "demo-phoenix"})
    out = evaluate(
        named, bpb_sets={"license": ["Python is a programming language."]}, tasks=(), batch_size=8, telemetry_root=root
    )
    frame = TelemetryStore(root).query(run="demo-phoenix")
    got = {(m, s, p): v for m, s, v, p in frame.select("metric", "step", "value", "phase").iter_rows()}
    assert got == {
        ("eval.bpb.micro", 10, "phoenix"): pytest.approx(out["bpb"]["micro_bpb"]),
        ("eval.bpb.macro", 10, "phoenix"): pytest.approx(out["bpb"]["macro_bpb"]),
        ("eval.bpb.license", 10, "phoenix"): pytest.approx(out["bpb"]["sets"]["license"]["bpb"]),
    }

    # a checkpoint from before telemetry names no run: nothing appended, unless a run is given
    old = checkpoint(tmp_path / "old", {})
    evaluate(old, bpb_sets={"license": ["abc"]}, tasks=(), batch_size=8, telemetry_root=root)
    assert TelemetryStore(root).runs() == ["demo-phoenix"]
    evaluate(old, bpb_sets={"license": ["abc"]}, tasks=(), batch_size=8, telemetry_root=root, telemetry_run="old")
    assert TelemetryStore(root).runs() == ["demo-phoenix", "old"]


def test_a_set_name_that_cannot_be_a_metric_fails_before_scoring(checkpoint, tmp_path):
    from marin_assets.evaluation import evaluate

    folder = checkpoint(tmp_path / "c", {"telemetry_run": "r"})
    with pytest.raises(ValueError, match="eval set or task name.*'eval.bpb.web/x'"):
        evaluate(folder, bpb_sets={"web/x": ["abc"]}, tasks=(), telemetry_root=str(tmp_path / "t"))
