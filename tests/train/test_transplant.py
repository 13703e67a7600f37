"""Cross-architecture warm start (marin_assets/train/checkpoints/transplant.py): a checkpoint into a model with QK-norm, and
a dense checkpoint upcycled into a MoE, each by a declarative table of rules; every mismatch is one line naming
the parameter. The trained cases (slow) measure the loss right before and after the switch and after N steps."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from marin_assets.cli import main
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints.necromancy import open_checkpoint
from marin_assets.train.checkpoints.transplant import MAPPINGS, map_params, param_names, saved_params, transplant
from marin_assets.train.config import config_from_dict, config_to_dict
from marin_assets.train.data.heldout import validation_loss
from marin_assets.train.loop import train
from marin_assets.train.optimizers import make_optimizer
from marin_assets.train.state import init_state, moe_model
from tests.support.configs import TINY_MODEL, TINY_TRAIN

MODEL = moe_model()
NO_QK = dict(TINY_MODEL, qk_norm=False)
DENSE = dict(TINY_MODEL, n_routed_experts=0)  # d_ff 64: the dense MLP
UPCYCLED = dict(TINY_MODEL, expert_d_ff=64)  # 4 experts top-2 and one shared expert, each as wide as the MLP


def config(model: dict, **fields):
    return config_from_dict(dict(TINY_TRAIN, model=model, **fields))


def random_params(model: dict, seed: int = 0) -> dict:
    """{"layers/wq": array} of an initialised model (norm gains perturbed, so a copy is told from a fresh one)."""
    params = MODEL.init_params(config(model).model, jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    return {
        name: (np.asarray(x) + (0.1 * rng.normal(size=x.shape) if "norm" in name else 0.0)).astype(np.float32)
        for name, x in param_names(params).items()
    }


def save_source(root, model: dict, step: int = 7) -> str:
    """An untrained checkpoint of ``model`` with the meta a train run writes."""
    cfg = config(model)
    opt = make_optimizer(cfg.optimizer, MODEL.init_params(cfg.model, jax.random.PRNGKey(0)))
    state = init_state(cfg, opt, MODEL)
    meta = {
        "config": config_to_dict(cfg),
        "data_position": {"batches": step, "consumed": {"train": 4 * step}},
        "phase_start_step": 0,
        "tokens_before_phase": 0,
        "tokens": step * cfg.tokens_per_step,
        "phase": "main",
        "optimizer": cfg.optimizer.name,
        "telemetry_run": None,
        "data_tokenizers": {},
    }
    return str(ckpt.save(root, step, state.replace(step=jnp.int32(step)).to_dict(), meta))


def losses(params_by_name: dict, model: dict, tokens) -> float:
    cfg = config(model).model
    template = MODEL.init_params(cfg, jax.random.PRNGKey(0))
    tree = jax.tree_util.tree_unflatten(jax.tree.structure(template), [params_by_name[n] for n in param_names(template)])
    return float(MODEL.loss_fn(tree, tokens, cfg, MODEL.init_router_bias(cfg))[0])  # no EP layer: dropless


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 257, (4, 32)), jnp.int32)


# -- the tables -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [1, 0])
def test_upcycled_moe_computes_the_dense_models_function(shared):
    """Experts copied from the MLP, routing weights summing to one: the routed output is the MLP's whatever the
    router picks; with a shared expert both halves carry half. Measured: equal to float rounding (< 1e-5)."""
    dense = random_params(DENSE)
    dense["layers/w_down"] *= 30  # an MLP whose output moves the loss (at init it barely does), so a doubling shows
    target = dict(UPCYCLED, n_shared_experts=shared)
    moe = param_names(map_params(MAPPINGS["upcycle"], dense, config(target), MODEL, seed=3))
    np.testing.assert_array_equal(moe["layers/e_gate"][:, 2], dense["layers/w_gate"])
    assert moe["layers/router"].std() > 0  # small random router: tokens spread over the experts from the start
    before, after = losses(dense, DENSE, TOKENS), losses(moe, target, TOKENS)
    assert abs(after - before) < 1e-5 * before, (before, after)


def test_qk_norm_gains_start_at_ones_and_every_weight_is_copied():
    source = random_params(NO_QK)
    target = param_names(map_params(MAPPINGS["qk_norm"], source, config(TINY_MODEL), MODEL))
    for name in ("layers/q_norm", "layers/k_norm"):
        np.testing.assert_array_equal(target[name], np.ones_like(source[name]))  # identity scale, not the source's
    for name in source:
        if name not in ("layers/q_norm", "layers/k_norm"):
            np.testing.assert_array_equal(target[name], source[name], err_msg=name)


def test_qk_norm_takes_a_source_without_the_gains():
    """A Llama-style tree has no q_norm/k_norm at all: nothing to leave behind, the gains are made."""
    source = {k: v for k, v in random_params(NO_QK).items() if k not in ("layers/q_norm", "layers/k_norm")}
    target = param_names(map_params(MAPPINGS["qk_norm"], source, config(TINY_MODEL), MODEL))
    np.testing.assert_array_equal(target["layers/k_norm"], 1.0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.pop("layers/wq"), "target layers/wq reads source parameter layers/wq, which the checkpoint does not have"),
        (lambda p: p.update({"layers/bq": np.zeros((1, 32))}), "source parameter layers/bq is not used by any rule"),
        (
            lambda p: p.update({"layers/wo": np.zeros((1, 16, 32))}),
            r"layers/wo from layers/wo \(copy\): source shape \[1, 16, 32\] gives \[1, 16, 32\], the target needs \[1, 32, 32\]",
        ),
    ],
)
def test_a_missing_extra_or_misshapen_parameter_is_one_line_naming_it(change, message):
    source = random_params(NO_QK)
    change(source)
    with pytest.raises(ValueError, match=message) as info:
        map_params(MAPPINGS["qk_norm"], source, config(TINY_MODEL), MODEL)
    assert "\n" not in str(info.value)


def test_a_target_parameter_without_a_rule_or_experts_of_another_width_are_named():
    dense = random_params(DENSE)
    with pytest.raises(ValueError, match="target parameter layers/latent_down has no rule"):
        map_params(MAPPINGS["upcycle"], dense, config(dict(UPCYCLED, latent_dim=16)), MODEL)
    with pytest.raises(
        ValueError,
        match=r"layers/e_down from layers/w_down \(experts_down\): source \[1, 64, 32\] "
        r"cannot fill 4 experts of shape \[1, 32, 32\]",
    ):
        map_params(MAPPINGS["upcycle"], dense, config(dict(UPCYCLED, expert_d_ff=32, n_shared_experts=0)), MODEL)


def test_transplant_writes_a_target_checkpoint_a_warm_start_reads(tmp_path):
    source = save_source(tmp_path / "src", DENSE)
    target = config(UPCYCLED)
    done = transplant(source, target, "upcycle", tmp_path / "new", seed=1)
    arrays, meta = ckpt.load(done.checkpoint)
    assert done.step == meta["step"] == 7 and meta["data_position"]["batches"] == 7
    assert meta["config"] == config_to_dict(target) and meta["transplant"]["mapping"] == "upcycle"
    assert ["layers/e_down", "layers/w_down", "experts_down"] in meta["transplant"]["rules"]
    _, _, cfg, _, state = open_checkpoint(done.checkpoint, MODEL)  # the target tree, leaf for leaf
    assert cfg == target and state.router_bias.shape == (1, 4) and int(state.opt_state.count) == 0
    np.testing.assert_array_equal(saved_params(arrays)["embed"], saved_params(ckpt.load(source)[0])["embed"])
    with pytest.raises(ValueError, match="already has checkpoints"):
        transplant(source, target, "upcycle", tmp_path / "new")


@pytest.mark.parametrize(
    "mapping, source_model, target_model, message",
    [
        ("qk_norm", TINY_MODEL, TINY_MODEL, "the source model already has QK-norm"),
        ("qk_norm", NO_QK, dict(TINY_MODEL, d_model=64), "model.d_model is 32 in the source and 64 in the target"),
        ("upcycle", TINY_MODEL, UPCYCLED, "the source model is not dense"),
    ],
)
def test_models_the_mapping_cannot_join_are_refused_before_anything_is_written(
    tmp_path, mapping, source_model, target_model, message
):
    source = save_source(tmp_path / "src", source_model)
    with pytest.raises(ValueError, match=message):
        transplant(source, config(target_model), mapping, tmp_path / "new")
    assert not (tmp_path / "new").exists()


# -- trained: the loss across the switch ----------------------------------------------------------------------


def held_out(folder, caches) -> float:
    """Cross-entropy of a checkpoint on the first windows of the caches (the same tokens for every model)."""
    _, _, cfg, _, state = open_checkpoint(folder, MODEL)
    return validation_loss(cfg, MODEL, state, caches)


RECOVER_STEPS = 12
AFTER = {"num_steps": RECOVER_STEPS, "schedule": dict(TINY_TRAIN["schedule"], warmup_steps=2, decay_steps=2)}


@pytest.mark.slow
def test_qk_norm_switch_from_the_cli_keeps_the_loss_and_recovers(caches, jax_cache, tmp_path):
    """A 24-step model without QK-norm, switched by `marin train transplant`, warm-started for 12 steps.
    Stated: the loss right after the switch within 5% of the loss before; 12 steps later below the loss before.
    Measured (held-out windows): 4.0242 -> 4.0244 (factor 1.00005) -> 3.841 after 12 steps. Attention in this
    tiny model is nearly uniform (making it exactly uniform moves the loss 0.03 nats), which is why the new
    normalisation costs so little here; a larger trained model pays more (the issue's 32B run spiked)."""
    source = train(config(NO_QK, num_steps=24, checkpoint_every_steps=24), caches, tmp_path / "src")
    before = held_out(source.checkpoint_dir, caches)
    target_yaml = tmp_path / "target.yaml"
    target_yaml.write_text(
        yaml.safe_dump(dict(TINY_TRAIN, model={k: v for k, v in TINY_MODEL.items() if k != "vocab_size"}, **AFTER))
    )
    assert (
        main(
            [
                "train",
                "transplant",
                "--checkpoint",
                str(tmp_path / "src"),
                "--config",
                str(target_yaml),
                "--mapping",
                "qk_norm",
                "--out",
                str(tmp_path / "switched"),
            ]
        )
        == 0
    )
    switched = ckpt.latest_valid(tmp_path / "switched" / "checkpoints")
    right_after = held_out(switched, caches)
    assert abs(right_after / before - 1) < 0.05, (before, right_after)
    target = config_from_dict(yaml.safe_load(target_yaml.read_text()), vocab_size=TINY_MODEL["vocab_size"])
    recovered = train(target, caches, tmp_path / "after", warm_start=tmp_path / "switched")
    assert recovered.final_step == 24 + RECOVER_STEPS  # the global step goes on from the source's
    assert held_out(recovered.checkpoint_dir, caches) < before


@pytest.mark.slow
def test_dense_upcycled_into_a_moe_keeps_the_loss_and_trains_on(caches, jax_cache, tmp_path):
    """Stated: the upcycled model's held-out loss equals the dense one's to 1e-5 (relative) and is lower after 12
    MoE steps. Measured: 4.0571 -> 4.0571 -> 3.832 (the dense model, trained on 12 steps alike: 3.856)."""
    source = train(config(DENSE, num_steps=24, checkpoint_every_steps=24), caches, tmp_path / "src")
    before = held_out(source.checkpoint_dir, caches)
    target = config(UPCYCLED, **AFTER)
    done = transplant(source.checkpoint_dir, target, "upcycle", tmp_path / "moe")
    assert abs(held_out(done.checkpoint, caches) / before - 1) < 1e-5
    trained = train(target, caches, tmp_path / "after", warm_start=tmp_path / "moe")
    assert held_out(trained.checkpoint_dir, caches) < before
    assert json.loads((tmp_path / "after" / "train_result.json").read_text())["final_step"] == 24 + RECOVER_STEPS
