"""The scaling assets end to end on a tiny real corpus: the DataKit's datasets through the
real ``mixture`` asset, sweep partitions -> fit -> prediction -> check, and ``run_ladder``.

The data is real text (a few Python standard-library source files) in stand-in byte-level
datasets (tests/support/datasets.py: real shard caches and dataset indexes), so the demo's
download pipeline is not needed. The ladder is shrunk: one real training partition (a few dozen steps), and the whole
fit -> prediction -> check path (also through ``run_ladder``) on a known loss law at the
planner's real (N, D, C), where the answer is known.
"""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import dagster as dg
import pytest

from assets.datakit.datasets import mixture_asset
from assets.scaling import DEMO_LADDER, build_scaling_assets, scaling_assets, scaling_checks
from demo.scaling import run_ladder
from jobs import scaling_job
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.scaling.ladder import Ladder, write_file
from marin_assets.scaling.sweep import parse_partition_key, partition_key
from marin_assets.store import ArtifactRef
from tests.support.byte_tokens import VOCAB_SIZE
from tests.support.datasets import byte_datasets, mixture_run_config

VOCAB = VOCAB_SIZE  # the code location's byte tokenizer
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




def stdlib_blocks(files: list[str]) -> list[str]:
    """One document per blank-line-separated block of at least a few lines of the files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [b for name in files for b in (stdlib / name).read_text().split("\n\n") if len(b) > 200]


def _split(docs: list[str]) -> tuple[list[str], list[str]]:
    return [d for i, d in enumerate(docs) if i % 10], [d for i, d in enumerate(docs) if i % 10 == 0]


DATASETS = byte_datasets({source: _split(stdlib_blocks(files)) for source, files in STDLIB_FILES.items()}, shards_per_source=2)
mixture = mixture_asset(list(STDLIB_FILES))
DATA = [*DATASETS, mixture]
DATA_CONFIG = mixture_run_config({source: 1.0 for source in STDLIB_FILES})


@pytest.fixture(scope="module")
def data_store(tmp_path_factory):
    """A store holding the datasets and the mixture (the real asset)."""
    prefix = tmp_path_factory.mktemp("scaling-store")
    with dg.instance_for_test() as instance:
        result = dg.materialize(DATA, instance=instance, resources=resources(prefix), run_config=DATA_CONFIG)
    assert result.success
    return prefix, result.output_for_node("mixture")


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


def test_every_demo_partition_is_plannable_with_the_default_sweep_config():
    from assets.scaling import SweepConfig
    from marin_assets.scaling.sweep import plan_run

    config = SweepConfig(vocab_size=VOCAB)
    for key in DEMO_LADDER.keys():
        budget, width = parse_partition_key(key)
        cand = plan_run(budget, width, config)  # raises with the reason if the planner has no run
        assert cand.budget == pytest.approx(budget, rel=0.05)  # snapped to its 1.1 bucket
        assert abs(cand.flops / cand.budget - 1) <= config.tolerance and cand.steps >= config.min_steps


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
    assert sweep.dependency_keys == {dg.AssetKey("mixture")}  # the ladder reads the DataKit's datasets
    defs = dg.Definitions(assets=[*scaling_assets, *DATA], asset_checks=scaling_checks,
                          jobs=[scaling_job], resources=resources(Path("/nonexistent")))
    defs.resolve_all_job_defs()
    assert set(defs.resolve_job_def("scaling").asset_layer.executable_asset_keys) == {a.key for a in scaling_assets}


def test_the_ladder_reads_the_mixtures_datasets(data_store):
    from assets.scaling import ladder_data

    _, mixture_ref = data_store
    datasets, vocab = ladder_data(mixture_ref)
    assert vocab == VOCAB and set(datasets) == set(STDLIB_FILES)
    assert all(path.endswith("dataset.json") for path in datasets.values())


def law_run(budget, width, config, train_caches, validation_caches, out_dir, log=print):
    """A sweep run whose loss is the known law at the planned (N, D): no training."""
    from marin_assets.scaling.sweep import plan_run

    cand = plan_run(budget, width, config)
    noise = 1e-3 * math.sin(7.0 * width + math.log(budget))  # deterministic, |noise| <= 0.1%
    loss = (LAW["E"] + LAW["A"] / cand.params ** LAW["alpha"] + LAW["B"] / cand.tokens ** LAW["beta"]) * (1 + noise)
    write_file(out_dir, "run.json", json.dumps({"plan": cand.as_dict(), "validation_loss": {"mean": loss}}))
    return {"budget": cand.budget, "width": width, "params": cand.params, "tokens": cand.tokens, "flops": cand.flops,
            "steps": cand.steps, "batch_size": cand.batch_size, "validation_loss": loss, "train_loss": loss,
            "vocab_size": config.vocab_size}


def test_real_sweep_partition_trains_to_its_budget(data_store):
    prefix, _ = data_store
    (sweep, *_), _ = build_scaling_assets(REAL_LADDER)
    with dg.instance_for_test() as instance:
        result = dg.materialize([*DATA, sweep], selection=[sweep.key],
                                partition_key=REAL_KEY, instance=instance, resources=resources(prefix),
                                run_config={"ops": {"sweep": {"config": SWEEP_CONFIG}}})
    ref: ArtifactRef = result.output_for_node("sweep")
    c = ref.counts
    vocab = VOCAB
    assert c["vocab_size"] == VOCAB  # taken from the datasets' tokenizer, not configured
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
    assert run["train"]["counts"]["skipped_spike"] == 0  # the sweep turns the spike-skip test off
    assert set(run["validation_loss"]) == set(STDLIB_FILES) | {"mean"}
    assert (Path(ref.data_path) / "loss_curve.png").exists()
    assert not (Path(ref.data_path) / "checkpoints").exists()  # weights of sweep runs are not kept


def test_ladder_fit_predict_and_check(data_store, tmp_path):
    prefix, _ = data_store
    assets, checks = build_scaling_assets(LAW_LADDER, run_fn=law_run)
    sweep, scaling_fit, prediction = assets
    res = resources(prefix)
    sweep_cfg = {"ops": {"sweep": {"config": SWEEP_CONFIG}}}
    fit_cfg = {"ops": {"scaling_fit": {"config": {"bootstrap_n": 20}},
                       "prediction": {"config": {"sweep": SWEEP_CONFIG, "max_width": 64}}}}
    everything = [*DATA, sweep, scaling_fit, prediction, *checks]

    def fit_and_check():
        return dg.materialize(everything, selection=[scaling_fit.key, prediction.key], instance=instance,
                              resources=res, run_config=fit_cfg)

    def run_sweep(keys):
        for key in keys:
            assert dg.materialize([*DATA, sweep], selection=[sweep.key], partition_key=key, instance=instance,
                                  resources=res, run_config=sweep_cfg).success

    with dg.instance_for_test() as instance:
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


def test_run_ladder_materialises_everything_and_reports_the_error(tmp_path):
    """``run_ladder`` (what ``marin demo`` calls) on the law ladder: every partition, fit,
    prediction and the check, with the error it reports equal to the check's."""
    assets, checks = build_scaling_assets(LAW_LADDER, run_fn=law_run)
    defs = dg.Definitions(assets=[*DATA, *assets], asset_checks=checks, jobs=[scaling_job], resources=resources(tmp_path / "store"))
    run_config = {"ops": {"sweep": {"config": SWEEP_CONFIG},
                          "scaling_fit": {"config": {"bootstrap_n": 20}},
                          "prediction": {"config": {"sweep": SWEEP_CONFIG, "max_width": 64}}}}
    lines = []
    with dg.instance_for_test() as instance:
        assert dg.materialize(DATA, instance=instance, resources=resources(tmp_path / "store"), run_config=DATA_CONFIG).success
        marked = lambda run, tags: run({**tags, "test/mark": "ladder"})  # what the demo's progress reporter does
        out = run_ladder(defs, instance, LAW_LADDER, log=lines.append, run_config=run_config, execute=marked)
        ladder_runs = instance.get_runs(dg.RunsFilter(job_name="scaling"))
        assert len(ladder_runs) == 2  # every sweep partition in one range run, then fit + prediction
        assert all(r.tags.get("test/mark") == "ladder" for r in ladder_runs)  # the hook's tags reach every run
        done = instance.get_materialized_partitions(dg.AssetKey("sweep"))
        check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(dg.AssetKey("prediction"), "prediction_error")])

    assert done == set(LAW_LADDER.keys())  # every partition, the held-out budget's too
    (execution,) = check.values()
    meta = execution.event.dagster_event.event_specific_data.metadata
    assert out["relative_error"] == pytest.approx(meta["relative_error"].value)
    assert out["relative_error"] == pytest.approx((out["prediction"] - out["actual"]) / out["actual"])
    assert out["passed"] and abs(out["relative_error"]) <= LAW_LADDER.max_relative_error
    assert out["budgets_fitted"] == 3 and out["budgets_excluded"] == 0
    assert out["exponents"]["n_opt"] == pytest.approx(LAW["beta"] / (LAW["alpha"] + LAW["beta"]), abs=0.15)
    assert out["seconds"] > 0
    # One line per run (the sweep's range, the fit) plus the summary, which states the error.
    assert len(lines) == 2 + 1 and "C8e09-d8 .. " in lines[0]
    assert f"{out['relative_error']:+.2%}" in lines[-1]
