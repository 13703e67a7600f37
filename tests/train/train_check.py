"""``loop.train`` on one or two ("data", "expert") meshes, run as a subprocess: the mesh
equivalence tests' one harness (tests/train/conftest.py ``mesh_runs`` runs it once per test
session for every assertion of test_mesh.py, test_train_mesh.py and test_fsdp.py).

The environment says how many processes and devices (as the manifests do), because XLA_FLAGS
and jax.distributed must be set before JAX starts its backend. Each ``--layouts`` entry is a
``DATAxEXPERT`` mesh over the first DATA*EXPERT global devices (``1x1`` in a 4-device process
is the one-device mesh), or ``env``: the mesh the environment asks for, as a training pod builds
it (``make_mesh(model)``: MARIN_EXPERT_PARALLEL / MARIN_EP_DOMAIN_CHIPS). On each, every run
of ``--runs`` trains ``--steps`` steps of a 2-layer tiny MoE on the test caches, capacity factors 4
(the largest expert axis: nothing can drop), into ``--out/<layout>/<run>``; a run is a transport (``ragged``, ``pooled``) or
``fsdp_<transport>`` (the same with the FSDP state layout). Every process calls ``train`` alike
and process 0 writes the run's files, plus, from a hook at the last step, the final params
(``<run>.params.npz``) and the state's layout read from its arrays (``<run>.state.json``).

Per layout, ``--out/<layout>.json``: the mesh and process facts, host-side agreement across
processes and, with several processes, a negative control per transport: the loss of a random
batch with each process feeding its own rows vs. the first rows (a wrong slice). On a one-process
layout of several devices that trains ``fsdp_ragged`` (1x4), also ``microbatches``: one FSDP + EP step
in 2 microbatches vs. in one (``microbatch_control``, for tests/train/test_microbatches.py).

  python -m tests.train.train_check --caches caches.json --out DIR --layouts 1x1,1x4 --steps 20
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from tests.support.configs import TINY_TRAIN

CAPACITY = 4.0  # = the largest expert axis of the layouts: no assignment can drop
BATCH = 8
STEPS = 20  # what the equivalence tests train, as the criterion reads


def config(transport: str, steps: int, fsdp: bool = False):
    from marin_assets.train.config import config_from_dict

    # Two layers: the scan carries (and FSDP gathers) the stacked layer weights one layer at a time.
    model = dict(
        TINY_TRAIN["model"], n_layers=2, ep_transport=transport, capacity_factor_send=CAPACITY, capacity_factor_recv=CAPACITY
    )
    return config_from_dict(
        dict(TINY_TRAIN, model=model, num_steps=steps, batch_size=BATCH, checkpoint_every_steps=steps, fsdp=fsdp)
    )


def layout_mesh(name: str, model_config):
    """``"DATAxEXPERT"`` -> that mesh over the first DATA*EXPERT global devices; ``"env"`` -> the
    environment's mesh over every global device."""
    import jax

    if name == "env":
        return meshlib.make_mesh(model_config)
    data, expert = (int(x) for x in name.split("x"))
    return meshlib.make_mesh(model_config, expert=expert, devices=jax.devices()[: data * expert])


def state_layout(state) -> dict:
    """Per leaf of a state (its arrays): shape, itemsize, PartitionSpec and per-device shard shape."""
    import jax

    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(state):
        out[jax.tree_util.keystr(path)] = {
            "shape": list(x.shape),
            "itemsize": x.dtype.itemsize,
            "spec": [e if e is None or isinstance(e, str) else list(e) for e in x.sharding.spec],
            "shard": list(x.sharding.shard_shape(x.shape)),
        }
    return out


def final_state_hook(out: Path, transport: str, control: dict | None):
    """A hook for the last step: the final params (npz) and the state layout, written by process 0;
    with ``control`` (a dict), fills it with ``wrong_slice_control`` on the final state."""
    import jax

    from marin_assets.train.hooks import Hooks

    hooks = Hooks()

    @hooks.add_hook(every=None, at_end=True)
    def save(info) -> None:
        if control is not None:
            control.update(wrong_slice_control(info.state, transport))
        params = meshlib.host_state(info.state.params)  # a collective: every process calls it
        if distributed.is_writer():
            flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
            np.savez(f"{out}.params.npz", **flat)
            state = info.state.to_dict()
            Path(f"{out}.state.json").write_text(
                json.dumps(
                    {
                        "layout": state_layout(state),
                        "per_device_bytes": meshlib.per_device_bytes(state, jax.tree.map(lambda x: x.sharding, state)),
                    }
                )
            )

    return hooks


def wrong_slice_control(state, transport: str) -> dict:
    """The loss of one random batch under ``state`` with each process feeding its own rows
    ("good") and the first rows of the batch ("bad"): what a wrong slice does to the losses."""
    import jax

    from marin_assets.model import loss_fn

    mesh = state.router_bias.sharding.mesh
    cfg = config(transport, TINY_TRAIN["num_steps"]).model
    ep = meshlib.expert_parallel(mesh, cfg)
    weights = (state.params, state.router_bias)

    def step(weights, tokens):  # jit_step's shape: compiled once, then every process meets
        return weights, {"loss": loss_fn(weights[0], tokens, cfg, weights[1], None, ep)[0]}

    loss = meshlib.jit_step(step, mesh, jax.tree.map(lambda x: x.sharding, weights), n_scalars=0, donate=False)
    batch = np.random.default_rng([1234, 0]).integers(0, cfg.vocab_size, (BATCH, TINY_TRAIN["seq_len"]), dtype=np.int32)
    rows = meshlib.process_rows(mesh, BATCH)
    good = loss(weights, meshlib.shard_batch(mesh, batch[rows], BATCH))[1]["loss"]
    bad = loss(weights, meshlib.shard_batch(mesh, batch[: rows.stop - rows.start], BATCH))[1]["loss"]
    return {"good": float(good), "bad": float(bad)}


def one_step(config, batch, mesh, lr: float = 1e-2) -> tuple[dict, dict, dict]:
    """(params, gradient, metrics) after one step of ``train_step_for`` (the step ``train`` runs: a run's own
    when this process ran it) from ``config``'s initial state on ``batch``, the global batch (tokens or
    ``MaskedRows``: each process feeds its own rows). params and gradient: numpy pytrees, the gradient read off
    AdamW's first moment (after one step, (1 - beta1) x the gradient); metrics: loss, grad_norm, dropped and a
    MoE's per-step ``moe/...`` telemetry."""
    import jax

    from marin_assets.train.data.batches import MaskedRows
    from marin_assets.train.loop import default_model, init_state, state_layout, train_step_for

    model = default_model()
    opt, _, state_sh = state_layout(config, model, mesh)
    step = train_step_for(config, opt, model, mesh, state_sh)
    rows = meshlib.process_rows(mesh, config.batch_size)
    local = batch._make(None if part is None else part[rows] for part in batch) if isinstance(batch, MaskedRows) else batch[rows]
    state, metrics = step(
        meshlib.init_sharded(lambda: init_state(config, opt, model), mesh, config.fsdp),
        meshlib.shard_batch(mesh, local, config.batch_size),
        np.bool_(True),
        np.float32(lr),
    )
    assert config.optimizer.name == "adamw", "the gradient is read off AdamW's state"
    # host_state: a collective, every process calls it
    params, moment = meshlib.host_state((state.params, state.opt_state.mu))
    grads = jax.tree.map(lambda mu: mu / (1 - config.optimizer.beta1), moment)
    scalars = {k: float(metrics[k]) for k in ("loss", "grad_norm", "dropped")}
    return params, grads, scalars | {f"moe/{k}": float(v) for k, v in metrics.get("moe", {}).items() if np.ndim(v) == 0}


def max_abs_diff(a, b) -> float:
    import jax

    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def microbatch_control(config, mesh) -> dict:
    """One step of the ``fsdp_ragged`` run's config (FSDP, the tiny MoE over the expert axis) from its initial
    state on a random batch, in 2 microbatches vs. in one (the run's own compiled step): the largest
    |difference| of the params, gradient, loss and grad_norm; and the collectives XLA needs to split a batch
    into microbatches on this mesh (none: each device keeps its own rows)."""
    import jax

    from marin_assets.train import accumulate
    from marin_assets.train.config import replace

    batch = np.random.default_rng([1234, 1]).integers(0, config.model.vocab_size, (BATCH, config.seq_len), dtype=np.int32)
    (p1, g1, m1), (p2, g2, m2) = (one_step(replace(config, microbatches=m), batch, mesh) for m in (1, 2))
    split = jax.jit(lambda x: accumulate.split(x, 2, mesh), in_shardings=meshlib.batch_sharding(mesh))
    hlo = split.lower(jax.ShapeDtypeStruct((BATCH, config.seq_len), np.int32)).compile().as_text()
    return {
        "params": max_abs_diff(p1, p2),
        "gradient": max_abs_diff(g1, g2),
        "loss": abs(m1["loss"] - m2["loss"]),
        "loss_value": m1["loss"],
        "grad_norm": abs(m1["grad_norm"] - m2["grad_norm"]),
        "dropped": [m1["dropped"], m2["dropped"]],
        "split_collectives": sorted(op for op in COLLECTIVES if op in hlo),
    }


COLLECTIVES = ("all-gather", "all-to-all", "all-reduce", "collective-permute", "reduce-scatter")


def run_layout(name: str, runs: list[str], steps: int, caches: dict, out: Path, setup) -> dict:
    """Train every run of ``runs`` on layout ``name``; returns the layout's facts. With several
    processes, each non-FSDP run also does the wrong-slice control on its final state."""
    import jax

    from marin_assets.train.loop import train

    controls = {}
    for run in runs:
        transport, fsdp = run.removeprefix("fsdp_"), run.startswith("fsdp_")
        cfg = config(transport, steps, fsdp)
        mesh = layout_mesh(name, cfg.model)
        if fsdp and mesh.size == 1:
            continue  # one device: the FSDP layout is the replicated one (nothing to split)
        control = controls.setdefault(transport, {}) if setup.num_processes > 1 and not fsdp else None
        hooks = final_state_hook(out / name / run, transport, control)
        train(cfg, caches, out / name / run, resume=False, mesh=mesh, hooks=hooks)
    # On one process only (1x4): each process of a 2x2 would compile the step in microbatches again, on CPUs
    # the other groups' processes share (it measured the same there: a gradient within 6e-9, no row moved).
    control = "fsdp_ragged" in runs and mesh.size > 1 and setup.num_processes == 1
    facts = {"microbatches": microbatch_control(config("ragged", steps, fsdp=True), mesh)} if control else {}
    rows = meshlib.process_rows(mesh, BATCH)
    # Per row of the expert axis (an expert group), the process of each of its devices.
    groups = [[d.process_index for d in row] for row in mesh.devices.reshape(-1, mesh.shape["expert"])]
    return {
        "mesh": dict(mesh.shape),
        "processes": setup.num_processes,
        "devices": mesh.size,
        "global_devices": jax.device_count(),
        "rows": [rows.start, rows.stop],
        "wrong_slice": controls,
        "expert_group_processes": groups,
        **facts,
    }


def load_layout(root: Path, name: str) -> dict:
    """What the runs of layout ``name`` left under ``root``: the layout's JSON, and per run its
    metrics rows, final params and state layout (runs a layout skipped are absent)."""
    from marin_assets.train.metrics import read_metrics

    out = json.loads((root / f"{name}.json").read_text())
    out["runs"] = {}
    for metrics in sorted((root / name).glob("*/metrics.jsonl")):
        run = root / name / metrics.parent.name
        with np.load(f"{run}.params.npz") as z:
            params = {k: z[k] for k in z.files}
        out["runs"][metrics.parent.name] = {
            "rows": read_metrics(metrics),
            "params": params,
            "state": json.loads(Path(f"{run}.state.json").read_text()),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caches", required=True, help="JSON file: {source: cache dir}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--layouts", required=True, help="comma-separated DATAxEXPERT meshes or env, e.g. 1x1,1x4")
    ap.add_argument("--runs", default="ragged,pooled,fsdp_ragged")
    args = ap.parse_args()

    setup = distributed.init_distributed()
    caches = json.loads(Path(args.caches).read_text())
    out = Path(args.out)
    for name in args.layouts.split(","):
        result = run_layout(name, args.runs.split(","), args.steps, caches, out, setup)
        # Host-side agreement across processes: process 0's value everywhere; an AND of flags.
        result["agree"] = {
            "process0_value": distributed.agree(setup.process_id + 7),
            "all_true": distributed.all_processes(True),
            "one_false": distributed.all_processes(setup.process_id != 1),
        }
        if distributed.is_writer():
            (out / f"{name}.json").write_text(json.dumps(result))
    distributed.barrier("train_check_done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
