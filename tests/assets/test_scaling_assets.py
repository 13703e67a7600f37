"""The scaling assets end to end on a tiny real cache: sweep partitions -> fit -> prediction -> check.

The data is real text (a few Python standard-library source files), tokenized with our own
BPE into real Levanter caches by the DataKit functions; a test-local "tokenized" asset hands
those caches to the sweep, so the demo's download pipeline is not needed. The ladder is
shrunk: one real training partition (a few dozen steps), and the whole fit -> prediction ->
check path on a known loss law at the planner's real (N, D, C), where the answer is known.
"""

from __future__ import annotations

import json
import math
import shutil
import sysconfig
from pathlib import Path

import dagster as dg
import pytest

from assets.scaling import (
    DEMO_LADDER,
    Ladder,
    build_scaling_assets,
    parse_partition_key,
    partition_key,
    scaling_assets,
    scaling_checks,
)
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource, StageContext, versioned_asset
from marin_assets.store import ArtifactRef

VOCAB = 384
SEQ = 32
STDLIB_FILES = {"textwrap": ["textwrap.py", "string.py"], "argparse": ["argparse.py"]}

# Real training: one partition of this ladder (44 steps of a width-32 model) is trained.
REAL_LADDER = Ladder(budgets=(2e9, 4e9, 8e9), widths=((8, 16, 32),) * 3)
REAL_KEY = "C2e09-d32"

# The fit path runs on a known law L(N, D) = E + A/N^alpha + B/D^beta at the planner's real
# (N, D, C), with +-0.1% deterministic noise. 4 budgets a factor 2 apart: the envelope's 3
# parameters are fitted on 3 budgets and extrapolated to the 4th. The widths bracket the
# law's optimum at every fitted budget (16, 16, 24), so each parabola has an interior vertex.
LAW = dict(E=2.0, A=40.0, alpha=0.35, B=60.0, beta=0.30)
LAW_LADDER = Ladder(
    budgets=(8e9, 1.6e10, 3.2e10, 6.4e10),
    widths=((8, 16, 32), (8, 16, 32), (16, 24, 40), (16, 24, 32)),
    # The law's best loss along C is E + A' C^-a' only approximately (N counts embeddings the
    # FLOPs do not, and the parabola vertices are +-0.1% noisy), so a factor-2 extrapolation
    # is held to 1%: ten times the noise, yet far below the 8% loss drop per budget doubling.
    max_relative_error=0.01,
)
SWEEP_CONFIG = {"seq_len": SEQ, "head_dim": 8, "batch_sizes": [8], "min_steps": 20,
                "lr_base": 0.02, "lr_ref_width": 1024, "validation_windows": 64}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """Per-source Levanter caches <root>/<source>/{train,validation} from real stdlib text."""
    from marin_assets.datakit.normalize import NormalizeConfig, normalize
    from marin_assets.datakit.shards import list_shards
    from marin_assets.datakit.tokenize import TokenizeConfig, TokenizerTrainConfig, tokenize, train_tokenizer

    tmp = tmp_path_factory.mktemp("scaling-data")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shards = {}
    for source, files in STDLIB_FILES.items():
        docs = []
        for name in files:
            # One document per blank-line-separated block of at least a few lines.
            blocks = (stdlib / name).read_text().split("\n\n")
            docs += [b for b in blocks if len(b) > 200]
        (tmp / f"{source}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        normalize(str(tmp / f"{source}.jsonl"), str(tmp / "norm" / source), NormalizeConfig(source=source))
        shards[source] = list_shards(str(tmp / "norm" / source))
    all_shards = [p for ps in shards.values() for p in ps]
    train_tokenizer(all_shards, str(tmp / "tok"), TokenizerTrainConfig(vocab_size=VOCAB))
    tokens = {}
    for source, ps in shards.items():
        stats = tokenize(ps, str(tmp / "tok" / "tokenizer.json"), str(tmp / "caches" / source),
                         TokenizeConfig(validation_fraction=0.1))
        tokens[source] = {s: stats[s]["tokens"] for s in ("train", "validation")}
        assert tokens[source]["validation"] > 4 * SEQ, tokens
    return tmp / "caches", tokens


def tokenized_asset(root: Path, tokens: dict):
    @versioned_asset(key="tokenized", code_version="test")
    def tokenized(ctx: StageContext):
        for source in tokens:
            shutil.copytree(root / source, Path(ctx.out_dir) / source)
        return {"tokens": tokens}

    return tokenized


def resources(prefix: Path) -> dict:
    store = ArtifactStoreResource(prefix=str(prefix))
    return {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}


def test_partition_keys_round_trip_and_pass_store_validation():
    from marin_assets.store.names import validate_segment

    for key in DEMO_LADDER.keys() + LAW_LADDER.keys():
        assert validate_segment(key) == key
        budget, width = parse_partition_key(key)
        assert partition_key(budget, width) == key
    assert parse_partition_key("C2.5e11-d48") == (2.5e11, 48)
    with pytest.raises(ValueError, match="C<budget>-d<width>"):
        parse_partition_key("1e11|d32")
    # The demo ladder: >= 3 budgets x 3 sizes, fitted on all but the largest.
    assert len(DEMO_LADDER.budgets) >= 3 and all(len(w) >= 3 for w in DEMO_LADDER.widths)
    assert DEMO_LADDER.target_label not in DEMO_LADDER.fit_labels
    assert set(DEMO_LADDER.fit_keys).isdisjoint(DEMO_LADDER.target_keys)


def test_ladder_rejects_bad_shapes():
    with pytest.raises(ValueError, match=">= 3 budgets"):
        Ladder(budgets=(1e9, 2e9), widths=((8, 16, 32),) * 2)
    with pytest.raises(ValueError, match=">= 3 on a fitted budget"):
        Ladder(budgets=(1e9, 2e9, 4e9), widths=((8, 16, 32), (8, 16), (8, 16, 32)))
    with pytest.raises(ValueError, match="must not be fitted on"):
        Ladder(budgets=(1e9, 2e9, 4e9), widths=((8, 16, 32),) * 3, fit_budgets=(1e9, 4e9))


def test_exports_are_the_demo_ladder():
    keys = {a.key.to_user_string() for a in scaling_assets}
    assert keys == {"sweep", "scaling_fit", "prediction"}
    assert [c.check_specs_by_output_name for c in scaling_checks]
    sweep = next(a for a in scaling_assets if a.key.to_user_string() == "sweep")
    assert sorted(sweep.partitions_def.get_partition_keys()) == sorted(DEMO_LADDER.keys())
    dg.Definitions(assets=[*scaling_assets, tokenized_asset(Path("."), {})], asset_checks=scaling_checks,
                   resources=resources(Path("/nonexistent"))).resolve_all_job_defs()


def law_run(budget, width, config, train_caches, validation_caches, out_dir, log=print):
    """A sweep run whose loss is the known law at the planned (N, D): no training."""
    from assets.scaling import _write_text, plan_run

    cand = plan_run(budget, width, config)
    noise = 1e-3 * math.sin(7.0 * width + math.log(budget))  # deterministic, |noise| <= 0.1%
    loss = (LAW["E"] + LAW["A"] / cand.params ** LAW["alpha"] + LAW["B"] / cand.tokens ** LAW["beta"]) * (1 + noise)
    _write_text(out_dir, "run.json", json.dumps({"plan": cand.as_dict(), "validation_loss": {"mean": loss}}))
    return {"budget": cand.budget, "width": width, "params": cand.params, "tokens": cand.tokens, "flops": cand.flops,
            "steps": cand.steps, "batch_size": cand.batch_size, "validation_loss": loss, "train_loss": loss,
            "vocab_size": config.vocab_size}


def test_real_sweep_partition_trains_to_its_budget(cache_dir, tmp_path):
    root, tokens = cache_dir
    (sweep, *_), _ = build_scaling_assets(REAL_LADDER)
    tokenized = tokenized_asset(root, tokens)
    res = resources(tmp_path / "store")
    with dg.instance_for_test() as instance:
        assert dg.materialize([tokenized], instance=instance, resources=res).success
        result = dg.materialize([tokenized, sweep], selection=[sweep.key], partition_key=REAL_KEY, instance=instance,
                                resources=res, run_config={"ops": {"sweep": {"config": SWEEP_CONFIG}}})
    ref: ArtifactRef = result.output_for_node("sweep")
    c = ref.counts
    vocab = json.loads((root / "textwrap" / "stats.json").read_text())["vocab_size"]
    assert c["vocab_size"] == vocab  # taken from the tokenizer, not configured
    assert (c["budget"], c["width"]) == (pytest.approx(2e9, rel=0.05), 32)
    assert abs(c["flops"] / c["budget"] - 1) <= 0.04
    assert c["tokens"] == c["steps"] * c["batch_size"] * SEQ
    # It learned: held-out loss well below a uniform guess over the vocabulary, and the
    # training loss fell from its first step.
    assert c["validation_loss"] < math.log(vocab) - 0.5
    rows = [json.loads(line) for line in (Path(ref.data_path) / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == c["steps"] and rows[-1]["loss"] < rows[0]["loss"] - 0.5
    run = json.loads((Path(ref.data_path) / "run.json").read_text())
    assert run["validation_loss"]["mean"] == pytest.approx(c["validation_loss"])
    assert set(run["validation_loss"]) == set(tokens) | {"mean"}
    assert (Path(ref.data_path) / "loss_curve.png").exists()
    assert not (Path(ref.data_path) / "checkpoints").exists()  # weights of sweep runs are not kept


def test_ladder_fit_predict_and_check(cache_dir, tmp_path):
    root, tokens = cache_dir
    assets, checks = build_scaling_assets(LAW_LADDER, run_fn=law_run)
    sweep, scaling_fit, prediction = assets
    tokenized = tokenized_asset(root, tokens)
    res = resources(tmp_path / "store")
    sweep_cfg = {"ops": {"sweep": {"config": SWEEP_CONFIG}}}
    fit_cfg = {"ops": {"scaling_fit": {"config": {"bootstrap_n": 20}},
                       "prediction": {"config": {"sweep": SWEEP_CONFIG, "max_width": 64}}}}
    everything = [tokenized, sweep, scaling_fit, prediction, *checks]

    def fit_and_check():
        return dg.materialize(everything, selection=[scaling_fit.key, prediction.key], instance=instance,
                              resources=res, run_config=fit_cfg)

    def run_sweep(keys):
        for key in keys:
            assert dg.materialize([tokenized, sweep], selection=[sweep.key], partition_key=key, instance=instance,
                                  resources=res, run_config=sweep_cfg).success

    with dg.instance_for_test() as instance:
        assert dg.materialize([tokenized], instance=instance, resources=res).success
        # Only the fit budgets first: the prediction exists before the runs it predicts, and
        # the check says so (a warning) rather than passing.
        run_sweep(LAW_LADDER.fit_keys)
        result = fit_and_check()
        assert result.success
        (early,) = result.get_asset_check_evaluations()
        assert not early.passed and early.severity == dg.AssetCheckSeverity.WARN
        assert set(early.metadata["missing"].value) == set(LAW_LADDER.target_keys)
        fit = json.loads((Path(result.output_for_node("scaling_fit").data_path) / "fit.json").read_text())
        pred = json.loads((Path(result.output_for_node("prediction").data_path) / "prediction.json").read_text())

        run_sweep(LAW_LADDER.target_keys)
        # The target's runs are not the fit's inputs: fit and prediction are cache hits, and
        # the check now finds the actual runs and evaluates.
        result = fit_and_check()
        mats = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
        assert mats["scaling_fit"]["cache_hit"].value and mats["prediction"]["cache_hit"].value
        assert mats["scaling_fit"]["isoflop_curves"].value.count("data:image/png;base64,") == 1
        assert mats["scaling_fit"]["power_laws"].value.count("data:image/png;base64,") == 1
        (check,) = result.get_asset_check_evaluations()

    # The fit saw the three smaller budgets only and found every vertex.
    assert fit["n"] == len(LAW_LADDER.fit_keys) == 9
    assert len(fit["optima"]) == 3 and not fit["excluded_budgets"]
    assert fit["loss_law"]["kind"] == "envelope"
    # Under C ~ 6ND the law's optimum is N* ~ C^(beta/(alpha+beta)) = C^0.46 and D* ~ C^0.54.
    # Three budgets with the vertex of a 3-point parabola each: held to +-0.15.
    assert fit["n_opt_exponent"] == pytest.approx(LAW["beta"] / (LAW["alpha"] + LAW["beta"]), abs=0.15)
    assert fit["d_opt_exponent"] == pytest.approx(LAW["alpha"] / (LAW["alpha"] + LAW["beta"]), abs=0.15)
    for o in fit["optima"]:  # each vertex lies inside its budget's sampled sizes
        sizes = [r["params"] for r in fit["runs"] if abs(r["budget"] / o["budget"] - 1) < 0.01]
        assert len(sizes) == 3 and min(sizes) < o["params_opt"] < max(sizes)

    # The prediction extrapolates the fitted laws to the 4th budget.
    assert pred["budget"] == pytest.approx(LAW_LADDER.target, rel=0.05)
    assert pred["params_opt"] == pytest.approx(fit["n_opt_coefficient"] * pred["budget"] ** fit["n_opt_exponent"])
    env = fit["loss_law"]
    assert pred["loss"] == pytest.approx(env["E"] + env["A"] * pred["budget"] ** -env["alpha"])
    assert pred["config"]["params"] == pytest.approx(pred["params_opt"], rel=0.5)

    # The check compares with the best actual run at the target and reports the error.
    meta = check.metadata
    actual = meta["actual_runs"].value
    assert set(actual) == set(LAW_LADDER.target_keys)
    assert meta["actual_loss"].value == min(actual.values())
    err = (pred["loss"] - meta["actual_loss"].value) / meta["actual_loss"].value
    assert meta["relative_error"].value == pytest.approx(err)
    assert "data:image/png;base64," in meta["predicted_vs_actual"].value
    assert check.passed, f"extrapolation error {err:+.4f} on an exact law"
    print(f"law ladder: predicted {pred['loss']:.4f}, actual best {meta['actual_loss'].value:.4f}, error {err:+.4%}")
