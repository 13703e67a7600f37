"""The scaling assets end to end on a tiny real corpus: the DataKit's datasets through the
real ``mixture`` asset, lr_sweep -> sweep partitions -> fit -> pre-registered predictions ->
target runs -> comparison, and ``run_ladder``.

The data is real text (a few Python standard-library source files) in stand-in byte-level
datasets (tests/support/datasets.py: real shard caches and dataset indexes), so the demo's
download pipeline is not needed. One real training partition (a few dozen steps) shows the
recipe reaching the trainer; the whole protocol runs on a known loss law at the planner's
real (N, D, C), where the answer is known.
"""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import dagster as dg
import pytest

from assets.datakit.datasets import mixture_asset
from assets.scaling import build_scaling_assets, scaling_assets, scaling_checks
from assets.scaling_ladders import DEMO_LADDER, DENSE_LADDER, MOE_LADDER
from demo.scaling import ladder_steps, run_ladder
from jobs import scaling_job
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.scaling.extrapolation import STAMP_KEY, PredictionNotFrozen
from marin_assets.scaling.ladder import Ladder, Target
from marin_assets.scaling.sweep import parse_partition_key, parse_seeded_key, partition_key, plan_run
from marin_assets.store import ArtifactRef, ArtifactStore
from marin_assets.store.artifact_files import write_file
from marin_assets.store.lock_files import lock_path
from tests.support.byte_tokens import VOCAB_SIZE
from tests.support.datasets import byte_datasets, mixture_run_config

VOCAB = VOCAB_SIZE  # the code location's byte tokenizer
SEQ = 32
STDLIB_FILES = {"textwrap": ["textwrap.py", "string.py"], "argparse": ["argparse.py"]}

# Real training: one partition of this ladder (a width-32 model for a few dozen steps) is trained.
REAL_LADDER = Ladder(name="real", budgets=(2e9, 4e9), widths=((8, 16, 32),) * 2)
REAL_KEY = "C2e09-d32"

# The protocol runs on a known law L(N, D) = E + A/N^alpha + B/D^beta at the planner's real
# (N, D, C), with +-0.1% deterministic noise per seed. 3 budgets a factor 2 apart, 2 seeds;
# the widths bracket the law's optimum at every budget (16, 16, 24), so each parabola has
# an interior vertex; two targets at 2x and 4x C_fit. The law's best loss along C is
# E + A' C^-a' only approximately (N counts embeddings the FLOPs do not, the vertices are
# noisy), so the targets are held to 1%: ten times the noise, far below the loss drop.
LAW = dict(E=2.0, A=40.0, alpha=0.35, B=60.0, beta=0.30)
LAW_LADDER = Ladder(
    name="law",
    budgets=(8e9, 1.6e10, 3.2e10),
    widths=((8, 16, 32), (8, 16, 32), (16, 24, 40)),
    targets=(Target("x2", 2.0), Target("x4", 4.0)),
    seeds=(0, 1),
    max_relative_error=0.01,
)
# The recipes' LR enters the law runs as a penalty around this optimum (the lr_sweep must find it).
LR_OPT = 0.021
SWEEP_CONFIG = {"seq_len": SEQ, "batch_sizes": [8], "min_steps": 20, "validation_windows": 64}
LAW_RUN_CONFIG = {
    "ops": {
        op: {"config": cfg}
        for op, cfg in {
            "scaling__law__lr_sweep": {"sweep": SWEEP_CONFIG},
            "scaling__law__sweep": SWEEP_CONFIG,
            "scaling__law__fit": {"bootstrap_n": 20},
            **{f"scaling__law__{t}__prediction": {"sweep": SWEEP_CONFIG, "max_width": 64} for t in ("x2", "x4")},
            **{f"scaling__law__{t}__target": SWEEP_CONFIG for t in ("x2", "x4")},
        }.items()
    }
}


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

    for key in DENSE_LADDER.keys() + MOE_LADDER.keys() + LAW_LADDER.keys():
        assert validate_segment(key) == key
        budget, width, seed = parse_seeded_key(key)
        assert partition_key(budget, width, seed) == key
    assert parse_partition_key("C2.5e11-d48") == (2.5e11, 48)
    assert parse_seeded_key("C2.5e11-d48-s3") == (2.5e11, 48, 3)
    assert "C8e09-d8-s1" in LAW_LADDER.keys() and "C8e09-d8" in LAW_LADDER.keys()  # seed 0 keeps the plain key
    for bad in ("1e11|d32", "C1e11-d32-s0", "C1e11-d32\n"):
        with pytest.raises(ValueError, match=r"C<budget>-d<width>\[-s<seed>\]"):
            parse_seeded_key(bad)


@pytest.mark.parametrize("ladder", [DENSE_LADDER, MOE_LADDER], ids=["dense", "moe"])
def test_every_ladder_partition_is_plannable_with_the_default_sweep_config(ladder):
    from assets.scaling_configs import SweepConfig
    from marin_assets.scaling.ladder import SweepSettings
    from marin_assets.scaling.lr_sweep import resolve_recipe

    settings = dataclass_settings(SweepConfig(vocab_size=VOCAB))
    recipe = resolve_recipe(settings, {"recipe": "v2", "best_lr": 0.03})  # an lr_sweep's counts
    for key in ladder.keys():
        budget, width, _ = parse_seeded_key(key)
        cand = plan_run(budget, width, settings, recipe, ladder.family)  # raises with the reason if there is no run
        assert cand.budget == pytest.approx(budget, rel=0.05)  # snapped to its 1.1 bucket
        assert abs(cand.flops / cand.budget - 1) <= settings.tolerance and cand.steps >= settings.min_steps
        assert cand.optimizer.name == "adamh" and cand.config.init_std == pytest.approx(width**-0.5)
        assert (cand.config.n_routed_experts > 0) == (ladder is MOE_LADDER)
    assert isinstance(settings, SweepSettings)


def dataclass_settings(config):
    from marin_assets.orchestration.knob_configs import library_config
    from marin_assets.scaling.ladder import SweepSettings

    return library_config(config, SweepSettings)


def test_the_moe_ladder_is_the_main_runs_family_and_its_last_target_the_main_runs_model():
    from assets.scaling_ladders import MAIN_RUN_TOKENS
    from assets.train_base import TrainBaseConfig
    from marin_assets.model import count_params, flops_per_token

    main = TrainBaseConfig().model
    target = MOE_LADDER.targets[-1]
    assert (target.name, target.width, target.batch_size, target.tokens) == (
        "main",
        main.d_model,
        TrainBaseConfig().batch_size,
        MAIN_RUN_TOKENS,
    )
    assert DEMO_LADDER is MOE_LADDER  # the demo runs it: the watch judges the demo's run against its sweep
    family = target.family.family((main.d_model,), vocab_size=VOCAB, seq_len=64)
    model = family.build_config(*family.shape(main.d_model))
    for name in sorted(set(type(main).model_fields) - {"vocab_size", "max_seq_len"}):  # the shape, not the data's
        assert getattr(model, name) == getattr(main, name), name
    # The ladder's members only split their width into smaller heads (4, not 16): at the main run's
    # width, the same matrices (the q/k norm gains are per head size: 2 x 12 per layer fewer) and FLOPs.
    rung = MOE_LADDER.family.family((main.d_model,), vocab_size=VOCAB, seq_len=64)
    member = rung.build_config(*rung.shape(main.d_model))
    assert count_params(member)[1] == count_params(model)[1] - 2 * main.n_layers * (16 - 4)
    assert flops_per_token(member, 64) == pytest.approx(flops_per_token(model, 64), rel=1e-3)
    assert member.n_heads == 4 * model.n_heads and MOE_LADDER.family.moe == target.family.moe
    assert (member.router_gating, member.balancing) == (main.router_gating, main.balancing)  # the rungs route alike


def test_a_moe_family_recorded_before_its_router_fields_reads_as_it_trained():
    """Frozen predictions record their family (ladder_predict.frozen_candidate reads it back): one from before
    MoeShape named its router trained ModelConfig's (sigmoid gating, quantile balancing) and replans so."""
    from marin_assets.scaling.planner import FamilyShape, MoeShape

    old = MoeShape(**{"routed_experts": 4, "shared_experts": 1, "top_k": 2, "expert_ff_mult": 1.0})
    family = FamilyShape(head_dim=4, moe=old).family((16,), vocab_size=VOCAB, seq_len=64)
    model = family.build_config(*family.shape(16))
    assert (model.n_shared_experts, model.router_gating, model.balancing) == (1, "sigmoid", "quantile_exact")


def test_ladder_rejects_bad_shapes():
    with pytest.raises(ValueError, match=">= 2 budgets"):
        Ladder(name="x", budgets=(1e9,), widths=((8, 16, 32),))
    with pytest.raises(ValueError, match=">= 3 distinct widths"):
        Ladder(name="x", budgets=(1e9, 2e9), widths=((8, 16, 32), (8, 16)))
    with pytest.raises(ValueError, match="distinct names"):
        Ladder(name="x", budgets=(1e9, 2e9), widths=((8, 16, 32),) * 2, targets=(Target("a", 2), Target("a", 3)))
    with pytest.raises(ValueError, match="invalid ladder name"):
        Ladder(name="a/b", budgets=(1e9, 2e9), widths=((8, 16, 32),) * 2)
    with pytest.raises(ValueError, match="multiple"):
        Target("x1", 1.0)


def test_exports_are_the_demo_and_moe_ladders():
    keys = {a.key.to_user_string() for a in scaling_assets}
    steps = {
        ladder.name: [
            "lr_sweep",
            "sweep",
            "fit",
            "comparison",
            *(f"{t}/{kind}" for t in ladder.target_keys for kind in ("prediction", "target")),
        ]
        for ladder in (DENSE_LADDER, MOE_LADDER)
    }
    assert keys == {f"scaling/{ladder}/{step}" for ladder, names in steps.items() for step in names}
    assert DENSE_LADDER.target_keys == ["x3"] and MOE_LADDER.target_keys == ["x3", "main"]
    assert {(c.asset_key.to_user_string(), c.name) for check in scaling_checks for c in check.check_specs} == {
        (f"scaling/{ladder}/comparison", "prediction_error") for ladder in ("dense", "moe")
    }
    sweep = next(a for a in scaling_assets if a.key.to_user_string() == "scaling/moe/sweep")
    assert sorted(sweep.partitions_def.get_partition_keys()) == sorted(MOE_LADDER.keys())
    assert sweep.dependency_keys == {dg.AssetKey("mixture"), dg.AssetKey(["scaling", "moe", "lr_sweep"])}
    target = next(a for a in scaling_assets if a.key.to_user_string() == "scaling/moe/x3/target")
    assert target.dependency_keys == {dg.AssetKey("mixture"), dg.AssetKey(["scaling", "moe", "x3", "prediction"])}
    main = next(a for a in scaling_assets if a.key.to_user_string() == "scaling/moe/main/target")  # the demo's run itself
    assert main.dependency_keys == {
        dg.AssetKey("mixture"),
        dg.AssetKey(["scaling", "moe", "main", "prediction"]),
        dg.AssetKey(["train", "demo"]),
    }
    from assets.partitions import demo_phases

    main_run = dg.AssetSpec(["train", "demo"], partitions_def=demo_phases)  # the run the main target observes
    defs = dg.Definitions(
        assets=[*scaling_assets, *DATA, main_run],
        asset_checks=scaling_checks,
        jobs=[scaling_job],
        resources=resources(Path("/nonexistent")),
    )
    defs.resolve_all_job_defs()
    # The scaling job is the demo's ladder (one partitions definition per job: the dense sweep's is its own group's).
    assert {k.to_user_string() for k in defs.resolve_job_def("scaling").asset_layer.executable_asset_keys} == {
        k for k in keys if k.startswith("scaling/moe/")
    }


def test_the_ladder_reads_the_mixtures_datasets(data_store):
    from assets.scaling_configs import ladder_data

    _, mixture_ref = data_store
    datasets, vocab = ladder_data(mixture_ref)
    assert vocab == VOCAB and set(datasets) == set(STDLIB_FILES)
    assert all(path.endswith("dataset.json") for path in datasets.values())


@pytest.mark.slow  # a real sweep run trained through its asset
def test_real_sweep_partition_trains_with_its_recipe(data_store):
    """The recipe chosen by name reaches the run's training config: v2 trains with AdamH (no
    weight decay) at the fan-in init, at the LR the recipe gives its width and steps."""
    prefix, _ = data_store
    lr_sweep, sweep, *_ = build_scaling_assets(REAL_LADDER)[0]
    config = {**SWEEP_CONFIG, "recipe": "v2", "lr_base": 0.02}  # lr_base set: the lr_sweep is not read
    with dg.instance_for_test() as instance:
        assert dg.materialize(
            [*DATA, lr_sweep],
            selection=[lr_sweep.key],
            instance=instance,
            resources=resources(prefix),
            run_config={"ops": {"scaling__real__lr_sweep": {"config": {"sweep": {**config, "recipe": "v1"}}}}},
        ).success
        result = dg.materialize(
            [*DATA, lr_sweep, sweep],
            selection=[sweep.key],
            partition_key=REAL_KEY,
            instance=instance,
            resources=resources(prefix),
            run_config={"ops": {"scaling__real__sweep": {"config": config}}},
        )
    ref: ArtifactRef = result.output_for_node("scaling__real__sweep")
    c = ref.counts
    assert c["vocab_size"] == VOCAB  # taken from the datasets' tokenizer, not configured
    assert (c["budget"], c["width"]) == (pytest.approx(2e9, rel=0.05), 32)
    assert abs(c["flops"] / c["budget"] - 1) <= 0.04
    assert c["tokens"] == c["steps"] * c["batch_size"] * SEQ
    assert c["recipe"] == "v2" and c["optimizer"] == "adamh"
    assert c["learning_rate"] == pytest.approx(0.02 * (16 / 32) ** 0.5 * (150 / c["steps"]) ** 0.5)
    run = json.loads((Path(ref.data_path) / "run.json").read_text())
    assert run["optimizer"]["name"] == "adamh" and run["optimizer"]["weight_decay"] == 0.0
    assert run["model"]["init_std"] == pytest.approx(32**-0.5)
    # It learned: held-out loss well below a uniform guess over the vocabulary, and the
    # training loss fell from its first step.
    assert c["validation_loss"] < math.log(VOCAB) - 0.5
    rows = [json.loads(line) for line in (Path(ref.data_path) / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == c["steps"] and rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert run["validation_loss"]["mean"] == pytest.approx(c["validation_loss"])
    assert run["train"]["counts"]["skipped_spike"] == 0  # the sweep turns the spike-skip test off
    assert set(run["validation_loss"]) == set(STDLIB_FILES) | {"mean"}
    assert (Path(ref.data_path) / "loss_curve.png").exists()
    assert not (Path(ref.data_path) / "checkpoints").exists()  # weights of sweep runs are not kept


# ---------------------------------------------------------------- the protocol on a known law


def law_loss(params: float, tokens: float, lr: float, seed: int) -> float:
    noise = 1e-3 * math.sin(7.0 * params**0.5 + math.log(tokens) + 1.7 * seed)  # deterministic, |noise| <= 0.1%
    penalty = 0.05 * math.log10(lr / LR_OPT) ** 2  # the loss rises away from the best LR
    return (LAW["E"] + LAW["A"] / params ** LAW["alpha"] + LAW["B"] / tokens ** LAW["beta"]) * (1 + noise) + penalty


def law_train(cand, config, train_caches, validation_caches, out_dir, *, run_name, seed, log=print, record=None):
    """A ladder run whose loss is the known law at the planned (N, D) and LR: no training."""
    loss = law_loss(cand.params, cand.tokens, cand.learning_rate, seed)
    write_file(out_dir, "run.json", json.dumps({"plan": cand.as_dict(), "validation_loss": {"mean": loss}, **(record or {})}))
    return {
        "budget": cand.budget,
        "width": cand.width,
        "params": cand.params,
        "tokens": cand.tokens,
        "flops": cand.flops,
        "steps": cand.steps,
        "batch_size": cand.batch_size,
        "validation_loss": loss,
        "train_loss": loss,
        "vocab_size": config.vocab_size,
        "learning_rate": cand.learning_rate,
        "recipe": cand.recipe,
        "seed": seed,
    }


def law_run(budget, width, config, train_caches, validation_caches, out_dir, log=print, *, recipe, shape, seed, run_prefix):
    cand = plan_run(budget, width, config, recipe, shape)
    return law_train(cand, config, train_caches, validation_caches, out_dir, run_name=f"{run_prefix}-x", seed=seed) | {
        "lr_base": recipe.lr_base
    }


@pytest.fixture(scope="module")
def law_protocol(data_store, tmp_path_factory):
    """``run_ladder`` (what ``marin demo`` calls) over the law ladder in a fresh store."""
    prefix = tmp_path_factory.mktemp("law-store")
    assets, checks = build_scaling_assets(LAW_LADDER, run_fn=law_run, train_fn=law_train)
    defs = dg.Definitions(assets=[*DATA, *assets], asset_checks=checks, jobs=[scaling_job], resources=resources(prefix))
    lines = []
    with dg.instance_for_test() as instance:
        assert dg.materialize(DATA, instance=instance, resources=resources(prefix), run_config=DATA_CONFIG).success
        marked = lambda run, tags: run({**tags, "test/mark": "ladder"})  # what the demo's progress reporter does
        out = run_ladder(defs, instance, LAW_LADDER, log=lines.append, run_config=LAW_RUN_CONFIG, execute=marked)
        runs = instance.get_runs(dg.RunsFilter(job_name="scaling"))
        events = {
            key: instance.get_latest_materialization_event(dg.AssetKey.from_user_string(f"scaling/law/{key}"))
            for key in ("x2/prediction", "x4/prediction", "x2/target", "x4/target", "comparison")
        }
    return {"out": out, "lines": lines, "runs": runs, "events": events, "store": ArtifactStore(str(prefix)), "defs": defs}


def test_the_lr_sweep_retunes_the_reference_lr(law_protocol):
    # The grid is 0.5x, 1x and 2x v2's written-down base (3e-2); the law's best LR is 0.021, nearer
    # 0.015 than 0.03 in log LR: the grid's lowest loss is on its edge, so the sweep also trains 0.0075,
    # and the parabola through 0.0075, 0.015 and 0.03 finds it.
    assert law_protocol["out"]["best_lr"] == pytest.approx(LR_OPT, rel=0.02)


def test_the_protocol_predicts_each_target_before_its_run(law_protocol):
    out, store = law_protocol["out"], law_protocol["store"]
    assert set(out["targets"]) == {"x2", "x4"}
    for name, t in out["targets"].items():
        assert abs(t["relative_error"]) <= LAW_LADDER.max_relative_error, (name, t)
        assert t["relative_error"] == pytest.approx((t["predicted"] - t["actual"]) / t["actual"])
        # Two seeds: the prediction carries an interval from resampling them.
        assert t["interval"]["low"] < t["predicted"] < t["interval"]["high"] and t["interval"]["seeds_per_point"] == 2
    assert out["passed"] and out["budgets_fitted"] == 3 and out["budgets_excluded"] == 0
    assert out["exponents"]["n_opt"] == pytest.approx(LAW["beta"] / (LAW["alpha"] + LAW["beta"]), abs=0.15)
    # Ladder compute (its 18 runs and the lr_sweep's 4) over the two targets' compute.
    comparison = json.loads((Path(store.read_pointer("scaling/law/comparison", None).data_path) / "comparison.json").read_text())
    assert out["ladder_cost_fraction"] == pytest.approx(
        (comparison["ladder_flops"] + comparison["lr_sweep_flops"]) / comparison["target_flops"]
    )
    assert comparison["target_flops"] == pytest.approx(sum(r["flops"] for r in comparison["rows"]))
    assert out["ladder_cost_fraction"] > 1  # 18 runs and an LR sweep against two targets at 2x and 4x


def test_each_prediction_is_locked_and_each_target_carries_its_hash(law_protocol):
    from marin_assets.store.lock_files import read_lock

    store = law_protocol["store"]
    for name in LAW_LADDER.target_keys:
        pred_ref = store.read_pointer(f"scaling/law/{name}/prediction", None)
        target_ref = store.read_pointer(f"scaling/law/{name}/target", None)
        lock = read_lock(store, pred_ref.counts["lock"])
        assert lock["frozen"] == json.loads((Path(pred_ref.data_path) / "prediction.json").read_text())
        run = json.loads((Path(target_ref.data_path) / "run.json").read_text())
        assert run[STAMP_KEY]["frozen_hash"] == lock["frozen_hash"] == target_ref.counts["frozen_hash"]
        # The target trained exactly the frozen config.
        assert run["plan"] == lock["frozen"]["config"]


def test_each_target_shows_its_frozen_prediction_against_its_run_on_its_own_page(law_protocol):
    """A reviewer finds predicted vs actual on the target asset, not only in the comparison or the logs."""
    events, store = law_protocol["events"], law_protocol["store"]
    for name in LAW_LADDER.target_keys:
        meta = events[f"{name}/target"].asset_materialization.metadata
        pred = json.loads(
            (Path(store.read_pointer(f"scaling/law/{name}/prediction", None).data_path) / "prediction.json").read_text()
        )
        actual = meta["count/validation_loss"].value
        assert meta["count/predicted"].value == pytest.approx(pred["loss"])
        assert meta["count/relative_error"].value == pytest.approx((pred["loss"] - actual) / actual)
        assert meta["count/within_bound"].value == (abs(meta["count/relative_error"].value) <= LAW_LADDER.max_relative_error)
        assert meta["count/interval_low"].value < pred["loss"] < meta["count/interval_high"].value
        assert meta["count/frozen_hash"].value  # the lock's hash of what was frozen
        assert meta["predicted_vs_actual"].value.count("data:image/png;base64,") == 1
        assert meta["count/predicted"].value == pytest.approx(law_protocol["out"]["targets"][name]["predicted"])


def test_the_comparison_has_its_plot_and_the_runs_were_in_order(law_protocol):
    events = law_protocol["events"]
    meta = events["comparison"].asset_materialization.metadata
    assert meta["predicted_vs_actual"].value.count("data:image/png;base64,") == 1
    assert meta["count/ladder_cost_fraction"].value == pytest.approx(law_protocol["out"]["ladder_cost_fraction"])
    # Every prediction was materialised before the first target run.
    assert max(events[f"{t}/prediction"].timestamp for t in ("x2", "x4")) < min(
        events[f"{t}/target"].timestamp for t in ("x2", "x4")
    )
    runs = law_protocol["runs"]
    assert len(runs) == 6 and all(r.tags.get("test/mark") == "ladder" for r in runs)
    lines = law_protocol["lines"]
    assert len(lines) == 6 + 1 and "C8e09-d8 .. " in lines[1]
    assert all(f"{t['relative_error']:+.2%}" in lines[-1] for t in law_protocol["out"]["targets"].values())
    assert ladder_steps(LAW_LADDER) == 1 + 18 + 1 + 2 * 2 + 1


def test_a_target_refuses_to_run_without_its_frozen_prediction(law_protocol, tmp_path):
    """Delete the lock of a registered prediction: its target run (a fresh version, so not a
    cache hit) refuses to start, naming the missing lock."""
    store, defs = law_protocol["store"], law_protocol["defs"]
    pred_ref = store.read_pointer("scaling/law/x2/prediction", None)
    path = Path(lock_path(store, pred_ref.counts["lock"]))
    saved = path.read_bytes()
    path.unlink()
    try:
        job = defs.resolve_job_def("scaling")
        config = {"ops": {"scaling__law__x2__target": {"config": {**SWEEP_CONFIG, "seed": 7}}}}  # a new version of the target
        with dg.instance_for_test() as instance, pytest.raises(PredictionNotFrozen, match="was not registered"):
            job.execute_in_process(
                instance=instance, run_config=config, asset_selection=[dg.AssetKey.from_user_string("scaling/law/x2/target")]
            )
    finally:
        path.write_bytes(saved)


# ---------------------------------------------------------------- a target that is the main run itself

OBS_MAIN_TOKENS = 81 * 8 * SEQ  # the main run's tokens: 81 steps of 8 x 32
OBS_LADDER = Ladder(
    name="obs",
    budgets=(8e9, 1.6e10),
    widths=((8, 16, 32),) * 2,
    max_relative_error=0.5,
    targets=(Target("x2", 2.0), Target("main", 4.0, width=32, batch_size=8, tokens=OBS_MAIN_TOKENS, observed="train/stub")),
)
OBS_RUN_CONFIG = {
    "ops": {
        op: {"config": cfg}
        for op, cfg in {
            "scaling__obs__lr_sweep": {"sweep": SWEEP_CONFIG},
            "scaling__obs__sweep": SWEEP_CONFIG,
            "scaling__obs__fit": {"bootstrap_n": 0},
            **{f"scaling__obs__{t}__prediction": {"sweep": SWEEP_CONFIG, "max_width": 64} for t in ("x2", "main")},
            **{f"scaling__obs__{t}__target": SWEEP_CONFIG for t in ("x2", "main")},
        }.items()
    }
}
stub_phases = dg.DynamicPartitionsDefinition(name="stub_phases")


def stub_main_run(store: ArtifactStore):
    """A main run of phases (no training): each phase's counts say the run's tokens so far; it
    checks, as it starts, that the main target's prediction is already frozen."""
    from marin_assets.orchestration import StageContext, versioned_asset
    from marin_assets.store.lock_files import read_lock

    @versioned_asset(key="train/stub", code_version="1", partitions_def=stub_phases, group_name="training")
    def stub(ctx: StageContext):
        pred = store.read_pointer("scaling/obs/main/prediction", None)
        assert pred is not None and read_lock(store, pred.counts["lock"]) is not None  # frozen before the run starts
        return {"tokens_trained": {"p1": OBS_MAIN_TOKENS // 2, "p2": OBS_MAIN_TOKENS}[ctx.partition_key]}

    return stub


def law_score(data_path, config, validation_caches, tokens, out_dir, *, record=None):
    """The observed run scored: the known law at the main model's N and the run's tokens."""
    cand = plan_run(1e10, 32, config)  # the pinned model (width 32 of the ladder's dense family); its N
    loss = law_loss(cand.params, tokens, LR_OPT, seed=3)
    write_file(out_dir, "run.json", json.dumps({"tokens": tokens, "validation_loss": {"mean": loss}, **(record or {})}))
    return {
        "width": 32,
        "params": cand.params,
        "tokens": tokens,
        "flops": cand.flops / cand.tokens * tokens,
        "validation_loss": loss,
    }


@pytest.mark.slow
def test_the_main_run_is_a_target_predicted_before_it_starts_and_scored_after(data_store, tmp_path):
    """An observed target: its prediction is frozen before ``main_run`` starts (the stub checks), the
    ladder trains nothing for it, and its actual is the main run's newest phase; without a main run
    ``run_ladder`` stops after the predictions."""
    from marin_assets.store.lock_files import read_lock

    store = ArtifactStore(str(tmp_path))
    stub = stub_main_run(store)
    assets, checks = build_scaling_assets(OBS_LADDER, run_fn=law_run, train_fn=law_train, score_fn=law_score)
    defs = dg.Definitions(assets=[*DATA, *assets, stub], asset_checks=checks, jobs=[scaling_job], resources=resources(tmp_path))
    with dg.instance_for_test() as instance:
        assert dg.materialize(DATA, instance=instance, resources=resources(tmp_path), run_config=DATA_CONFIG).success
        waiting = run_ladder(defs, instance, OBS_LADDER, run_config=OBS_RUN_CONFIG, log=lambda line: None)
        assert waiting["targets"] == {} and waiting["waiting_for"] == ["train/stub"]

        def main_run():
            instance.add_dynamic_partitions("stub_phases", ["p1", "p2"])
            for phase in ("p1", "p2"):
                assert dg.materialize([stub], instance=instance, resources=resources(tmp_path), partition_key=phase).success

        out = run_ladder(defs, instance, OBS_LADDER, run_config=OBS_RUN_CONFIG, log=lambda line: None, main_run=main_run)
    main = out["targets"]["main"]
    pred_ref = store.read_pointer("scaling/obs/main/prediction", None)
    pred = json.loads((Path(pred_ref.data_path) / "prediction.json").read_text())
    assert pred["config"]["tokens"] == OBS_MAIN_TOKENS and main["predicted"] == pytest.approx(pred["loss"])
    target_ref = store.read_pointer("scaling/obs/main/target", None)
    run = json.loads((Path(target_ref.data_path) / "run.json").read_text())
    assert (run["phase"], run["tokens"], target_ref.counts["phase"]) == ("p2", OBS_MAIN_TOKENS, "p2")  # the newest phase
    assert run[STAMP_KEY]["frozen_hash"] == read_lock(store, pred_ref.counts["lock"])["frozen_hash"]
    from marin_assets.scaling.ladder import SweepSettings

    params = plan_run(1e10, 32, SweepSettings(vocab_size=VOCAB, **SWEEP_CONFIG)).params
    assert main["actual"] == pytest.approx(law_loss(params, OBS_MAIN_TOKENS, LR_OPT, 3))
    assert set(out["targets"]) == {"x2", "main"}
