"""Necromancy (marin_assets/train/checkpoints/necromancy.py): the optimizer state rebuilt from gradients at frozen parameters.

On a quadratic toy the gradients are known in closed form, so the rebuilt moments are checked against
the moments written out by hand (exact to float rounding) and against those of a real, slowly moving
run (within a bound derived from how far Adam can move the parameters over its averaging horizon). In
the tiny training setting a planted spike (the second moment shrunk a millionfold) blows the resumed
run up, and the rebuilt state trains on below a stated loss bound.
"""

from __future__ import annotations

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from marin_assets.cli import main
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints.necromancy import BatchGradients, open_checkpoint, rebuild_opt_state
from marin_assets.train.config import OptimizerConfig, config_from_dict
from marin_assets.train.distributed.mesh import make_mesh
from marin_assets.train.loop import default_model, train
from marin_assets.train.metrics import read_metrics
from marin_assets.train.optimizers import make_optimizer
from tests.support.configs import TINY_TRAIN

B1, B2, MUON = 0.9, 0.95, 0.95


def toy_problem(seed: int = 0):
    """Params with a matrix, an embedding and a norm gain (three param groups), curvatures ``a`` and centres ``c``:
    loss(p; batch) = 0.5 * sum(a * (p - c - noise_batch)**2), so grad = a * (p - c - noise_batch)."""
    rng = np.random.default_rng(seed)
    shapes = {"w": (4, 3), "embed": (5, 3), "final_norm": (3,)}
    a = {k: rng.uniform(0.5, 2.0, s).astype(np.float32) for k, s in shapes.items()}
    c = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    p = {k: (c[k] + rng.choice([-1.0, 1.0], s) * rng.uniform(1.0, 2.0, s)).astype(np.float32) for k, s in shapes.items()}
    return a, c, p


def toy_grads(a, c, p, noise_scale: float, n: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{k: a[k] * (p[k] - c[k] - noise_scale * rng.normal(size=p[k].shape).astype(np.float32)) for k in p} for _ in range(n)]


def ema(grads: list[dict], key: str, beta: float, power: int = 1, scale: float | None = None) -> np.ndarray:
    """sum_i scale * beta**(N-i) * g_i**power: Adam's moments (scale 1-beta) and Muon's buffer (scale 1)."""
    n = len(grads)
    weight = (1 - beta) if scale is None else scale
    return sum(weight * beta ** (n - 1 - i) * np.asarray(g[key], np.float64) ** power for i, g in enumerate(grads))


@pytest.mark.parametrize("name", ["adamw", "adamh"])
def test_adam_moments_match_the_closed_form_of_a_frozen_run(name):
    a, c, p = toy_problem()
    grads = toy_grads(a, c, p, noise_scale=0.5, n=37)
    opt = make_optimizer(OptimizerConfig(name=name, beta1=B1, beta2=B2), p)
    state, count = rebuild_opt_state(opt, jax.tree.map(jnp.asarray, p), [jax.tree.map(jnp.asarray, g) for g in grads])
    assert count == 37 and int(state.count) == 37  # the bias correction 1 - beta**count undoes the zero start
    for key in p:
        np.testing.assert_allclose(np.asarray(state.mu[key]), ema(grads, key, B1), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(state.nu[key]), ema(grads, key, B2, power=2), rtol=2e-6, atol=1e-7)


def test_muon_momentum_and_adam_moments_match_the_closed_form():
    a, c, p = toy_problem(seed=3)
    grads = toy_grads(a, c, p, noise_scale=0.5, n=20, seed=4)
    opt = make_optimizer(OptimizerConfig(name="muon", beta1=B1, beta2=B2, muon_momentum=MUON), p)
    state, count = rebuild_opt_state(opt, jax.tree.map(jnp.asarray, p), [jax.tree.map(jnp.asarray, g) for g in grads])
    adam = state["adam"].inner_state
    assert count == 20 and int(adam.count) == 20
    # Muon's buffer is buf = momentum * buf + g (no 1 - momentum factor) on the hidden matrices only.
    np.testing.assert_allclose(np.asarray(state["momentum"]["w"]), ema(grads, "w", MUON, scale=1.0), rtol=2e-6, atol=1e-6)
    for key in ("embed", "final_norm"):  # Adam-updated under Muon
        np.testing.assert_allclose(np.asarray(adam.mu[key]), ema(grads, key, B1), rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(adam.nu[key]), ema(grads, key, B2, power=2), rtol=2e-6, atol=1e-7)


def test_no_gradient_is_a_one_line_error():
    _, _, p = toy_problem()
    opt = make_optimizer(OptimizerConfig(), p)
    with pytest.raises(ValueError, match="no usable gradient"):
        rebuild_opt_state(opt, p, [])


def test_batch_gradients_are_clipped_as_the_step_clips_and_skipped_batches_left_out():
    """The real path (BatchGradients -> rebuild_opt_state) on the toy: gradients clipped to guards.grad_clip by their
    global norm, a batch the loader flagged and one with a non-finite loss left out and counted."""
    a, c, p = toy_problem(seed=7)
    config = config_from_dict(dict(TINY_TRAIN, model=dict(TINY_TRAIN["model"], n_routed_experts=0), guards={"grad_clip": 0.5}))

    def loss_fn(params, targets, model_cfg, bias, mask=None, ep=None):
        return sum(0.5 * jnp.sum(a[k] * (params[k] - targets[k]) ** 2) for k in params), {}

    toy = dataclasses.replace(default_model(), loss_fn=loss_fn)
    rng = np.random.default_rng(8)
    targets = [{k: (c[k] + 0.5 * rng.normal(size=c[k].shape)).astype(np.float32) for k in c} for _ in range(6)]
    targets[4]["w"][0, 0] = np.nan  # a non-finite loss: skipped, whatever the guards' windows say
    batches = [(t, i != 2) for i, t in enumerate(targets)]  # batch 2 flagged corrupt by the loader
    params = jax.tree.map(jnp.asarray, p)
    stream = BatchGradients(config, toy, make_mesh(config.model), params, jnp.zeros((1, 0)), batches)
    opt = make_optimizer(OptimizerConfig(beta1=B1, beta2=B2), p)
    state, count = rebuild_opt_state(opt, params, stream)
    assert (count, stream.skipped, len(stream.losses)) == (4, 2, 4)
    used = [targets[i] for i in (0, 1, 3, 5)]
    grads = [{k: a[k] * (p[k] - t[k]) for k in p} for t in used]
    clipped = [
        {k: g[k] * min(1.0, 0.5 / np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g.values()))) for k in g} for g in grads
    ]
    for key in p:
        np.testing.assert_allclose(np.asarray(state.mu[key]), ema(clipped, key, B1), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.asarray(state.nu[key]), ema(clipped, key, B2, power=2), rtol=1e-5, atol=1e-9)


def test_rebuilt_moments_track_a_slowly_moving_run_within_the_stated_bound():
    """A real AdamW run (noise-free gradients, lr 1e-3, 200 steps) against moments rebuilt from 50 gradients at
    its final parameters. Bias-corrected, the run's moments are weighted averages of g(p_t) over its past; Adam
    moves a coordinate at most lr per step here ((1 - beta1) < sqrt(1 - beta2)), so the gradient that entered
    ``lag`` steps ago differs from today's by at most a * lr * lag, and the lags (from 1) of the bias-corrected
    average have E[lag] <= 1 / (1 - beta), E[lag**2] <= (1 + beta) / (1 - beta)**2:
        |m_hat - g|     <= a * lr / (1 - beta1)
        |v_hat - g**2|  <= 2 * |g| * a * lr / (1 - beta2) + (a * lr)**2 * (1 + beta2) / (1 - beta2)**2
    (plus float32 rounding, 1e-5)."""
    a, c, p = toy_problem(seed=5)
    lr, steps = 1e-3, 200
    opt = make_optimizer(OptimizerConfig(beta1=B1, beta2=B2, weight_decay=0.0), p)

    def grad(params):
        return jax.tree.map(lambda x, ak, ck: ak * (x - ck), params, a, c)

    @jax.jit
    def step(params, state):
        updates, state = opt.update(grad(params), state, params, jnp.float32(lr))
        return jax.tree.map(jnp.add, params, updates), state

    params, state = jax.tree.map(jnp.asarray, p), opt.init(p)
    for _ in range(steps):
        params, state = step(params, state)
    rebuilt, _ = rebuild_opt_state(opt, params, [grad(params)] * 50)
    for key in p:
        g = np.asarray(grad(params)[key], np.float64)
        true_m = np.asarray(state.mu[key]) / (1 - B1**steps)
        true_v = np.asarray(state.nu[key]) / (1 - B2**steps)
        new_m = np.asarray(rebuilt.mu[key]) / (1 - B1**50)
        new_v = np.asarray(rebuilt.nu[key]) / (1 - B2**50)
        np.testing.assert_allclose(new_m, g, rtol=1e-5)  # frozen: the average of one gradient is that gradient
        m_bound = a[key] * lr / (1 - B1) + 1e-5
        v_bound = 2 * np.abs(g) * a[key] * lr / (1 - B2) + (a[key] * lr) ** 2 * (1 + B2) / (1 - B2) ** 2 + 1e-5
        assert np.all(np.abs(true_m - new_m) <= m_bound), (key, np.abs(true_m - new_m).max(), m_bound.max())
        assert np.all(np.abs(true_v - new_v) <= v_bound), (key, np.abs(true_v - new_v).max(), v_bound.max())


# -- the command line and the tiny training setting ------------------------------------------------------------


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "taken" / "checkpoints" / "step-000000004").mkdir(parents=True)
    cases = [
        (["--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "new")], "no valid checkpoint in"),
        (
            ["--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "taken")],
            "already has checkpoints: give necromancy an out dir of its own",
        ),
    ]
    for argv, message in cases:
        assert main(["train", "necromancy", "--cache", str(tmp_path), "--steps", "4", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("marin train necromancy: ") and message in err and "\n" not in err
    with pytest.raises(SystemExit):  # argparse: a count that is not positive
        main(["train", "necromancy", "--checkpoint", "c", "--cache", "x", "--steps", "0", "--out", "o"])
    assert "--steps: must be a positive integer" in capsys.readouterr().err


def opt_leaves(arrays: dict, what: str) -> list[np.ndarray]:
    return [v for k, v in sorted(arrays.items()) if k.startswith(f"['opt_state'].{what}")]


SPIKE_STEPS = 24
# Guards off: the test is about the optimizer state, and the update clip and spike skip would hide the planted spike.
SPIKE_CONFIG = dict(
    TINY_TRAIN,
    num_steps=SPIKE_STEPS,
    checkpoint_every_steps=12,
    schedule=dict(TINY_TRAIN["schedule"], warmup_steps=2, decay_steps=2),
    guards={"window": 16, "min_history": 4, "skip_sigma": 0.0, "update_clip_sigma": 0.0},
)


@pytest.mark.slow
def test_a_planted_spike_recurs_from_the_corrupted_state_and_not_from_the_rebuilt_one(caches, jax_cache, tmp_path):
    """Checkpoint at step 12 of 24; its first moment inflated a thousandfold (the planted spike). Resumed as is,
    the run blows up (measured: loss 4.62 -> 46 -> ... 893). Rebuilt by `marin train necromancy --steps 8` and
    resumed, it stays at or below its loss at the checkpoint and ends where the uncorrupted run ends (measured:
    max 4.622 = step 13's loss; final 3.655 against 3.679). Stated bounds: corrupted max > 5x the step-13 loss;
    rebuilt max <= 1.02x it; rebuilt final within 0.1 nats of the uncorrupted run's."""
    config = config_from_dict(SPIKE_CONFIG)
    train(config, caches, tmp_path / "src", stop_at_step=13)  # checkpoint at 12, abandoned after step 13
    healthy = ckpt.latest_valid(tmp_path / "src" / "checkpoints")
    assert healthy.name == "step-000000012"
    _, meta, _, _, state = open_checkpoint(healthy, default_model())
    spiked = state.replace(opt_state=state.opt_state._replace(mu=jax.tree.map(lambda m: m * 1e3, state.opt_state.mu)))
    ckpt.save(tmp_path / "corrupt" / "checkpoints", 12, spiked.to_dict(), meta)
    shutil.copytree(tmp_path / "corrupt", tmp_path / "corrupt-resumed")
    shutil.copytree(tmp_path / "src" / "checkpoints" / healthy.name, tmp_path / "healthy" / "checkpoints" / healthy.name)

    corrupt = resumed_losses(config, caches, tmp_path / "corrupt-resumed")
    assert max(corrupt) > 5 * corrupt[0], corrupt

    argv = [
        "train",
        "necromancy",
        "--checkpoint",
        str(tmp_path / "corrupt"),
        "--cache",
        f"license={caches['license']}",
        "--cache",
        f"docs={caches['docs']}",
        "--steps",
        "8",
        "--out",
        str(tmp_path / "rebuilt"),
    ]
    assert main(argv) == 0
    arrays, rebuilt_meta = ckpt.load(tmp_path / "rebuilt" / "checkpoints" / "step-000000012")
    corrupt_arrays, _ = ckpt.load(tmp_path / "corrupt" / "checkpoints" / "step-000000012")
    record = rebuilt_meta["necromancy"]
    assert (record["gradients"], record["skipped_batches"], record["batch_steps"]) == (8, 0, [13, 20])
    assert int(arrays["['opt_state'].count"]) == 8  # the bias correction's count: 8 gradients since zero
    assert rebuilt_meta["data_position"] == meta["data_position"]
    for key in arrays:  # only the optimizer state differs from the source
        if not key.startswith("['opt_state']"):
            np.testing.assert_array_equal(arrays[key], corrupt_arrays[key], err_msg=key)
    assert max(np.abs(m).max() for m in opt_leaves(arrays, "mu")) * 100 < max(
        np.abs(m).max() for m in opt_leaves(corrupt_arrays, "mu")
    )

    rebuilt = resumed_losses(config, caches, tmp_path / "rebuilt")
    uncorrupted = resumed_losses(config, caches, tmp_path / "healthy")
    assert rebuilt[0] == corrupt[0] == uncorrupted[0]  # step 13 is computed before any update from the state
    assert max(rebuilt) <= 1.02 * rebuilt[0], rebuilt
    assert abs(rebuilt[-1] - uncorrupted[-1]) < 0.1, (rebuilt, uncorrupted)


def resumed_losses(config, caches, out) -> list[float]:
    result = train(config, caches, out, resume=True)
    rows = read_metrics(result.metrics_path)
    assert [r["step"] for r in rows] == list(range(13, SPIKE_STEPS + 1))
    return [r["loss"] for r in rows]


def test_a_document_masked_batch_gives_the_gradient_the_step_takes():
    """With document masking the loader hands MaskedRows with segment ids: the rebuilt moments' gradients are then
    those of the masked loss the train step took (not of attention across the documents)."""
    from marin_assets.model import init_params, loss_fn
    from marin_assets.train.data.batches import MaskedRows

    config = config_from_dict(dict(TINY_TRAIN, document_masking=True, guards={"grad_clip": 1e9}))  # no clipping
    params = init_params(config.model, jax.random.PRNGKey(3))
    bias = jnp.zeros((config.model.n_layers, config.model.n_routed_experts))
    tokens = np.random.default_rng(4).integers(0, 256, (config.batch_size, config.seq_len), dtype=np.int32)
    segments = np.repeat(np.arange(4), config.seq_len // 4)[None].repeat(config.batch_size, 0).astype(np.int32)
    batch = MaskedRows(tokens, np.ones_like(tokens), segments)
    (grads,) = list(BatchGradients(config, default_model(), make_mesh(config.model), params, bias, [(batch, True)]))

    def expected(segment_ids):
        return jax.grad(lambda p: loss_fn(p, tokens, config.model, bias, np.ones_like(tokens), segment_ids=segment_ids)[0])(
            params
        )

    def max_diff(a, b):
        return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))

    assert max_diff(grads, expected(segments)) <= 1e-6
    assert max_diff(grads, expected(None)) > 1e-4  # the documents' masking is what it kept
