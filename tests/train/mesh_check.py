"""One training-step harness on the ("data", "expert") mesh, run as a subprocess (test_mesh.py's
kill test runs it with --forever; the equivalence tests train through ``loop.train``, train_check.py).

The environment says how many processes and devices (as the manifests do:
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JOB_COMPLETION_INDEX, MARIN_DEVICES_PER_PROCESS),
because XLA_FLAGS and jax.distributed must be set before JAX starts its backend, and the
pytest process's JAX already has.

Each step: the global batch ``rng([seed, step])`` (every process draws the same one and
keeps only its rows), loss + grad through the model with the EP layer, an AdamW update,
the router-bias update. Process 0 writes {"losses", "dropped", "mesh", "params" (final,
...} per transport to --out and each transport's final params to --out.<transport>.npz.

  python -m tests.train.mesh_check --steps 20 --transports ragged,pooled --expert 4 --out r.json
  --forever: print one line per step until killed (the kill test).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from marin_assets.train import mesh as meshlib
from marin_assets.train import processes

BATCH, SEQ = 8, 16


def model_config(transport: str, capacity: float):
    from marin_assets.model import ModelConfig

    return ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16,
                       n_routed_experts=4, n_shared_experts=1, top_k=2, expert_d_ff=8, max_seq_len=SEQ,
                       capacity_factor_send=capacity, capacity_factor_recv=capacity,
                       ep_transport=transport, balancing="quantile_exact")


def run(setup, args, transport: str, bad_rows: bool = False) -> dict:
    """Train ``args.steps`` steps; bad_rows: first evaluate step 0 with every process
    feeding the first rows of the batch instead of its own (a wrong slice), reported as
    "bad_rows_loss0"; the same compiled step, so it costs one step."""
    import jax
    import numpy as np

    from marin_assets.model import init_params, init_router_bias, loss_fn, next_router_bias
    from marin_assets.train.optimizers import OptimizerConfig, make_optimizer

    cfg = model_config(transport, args.capacity)
    mesh = meshlib.make_mesh(cfg, expert=args.expert)
    meshlib.check_fits(mesh, cfg, BATCH, SEQ)
    ep = meshlib.expert_parallel(mesh, cfg)
    template = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    opt = make_optimizer(OptimizerConfig(), template)

    def init():
        params = init_params(cfg, jax.random.PRNGKey(0))
        # TrainState's field names: mesh.state_shardings keeps "router_bias" replicated under FSDP too
        return {"params": params, "opt_state": opt.init(params), "router_bias": init_router_bias(cfg)}

    state = meshlib.init_sharded(init, mesh)
    state_sh = meshlib.state_shardings(mesh, state)

    def step(state, tokens):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"], tokens, cfg, state["router_bias"], None, ep)
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"], 3e-3)
        params = jax.tree.map(lambda p, u: p + u, state["params"], updates)
        bias = next_router_bias(state["router_bias"], aux, cfg)
        return ({"params": params, "opt_state": opt_state, "router_bias": bias},
                {"loss": loss, "dropped": jax.numpy.sum(aux["dropped"])})

    step_fn = meshlib.jit_step(step, mesh, state_sh, n_scalars=0, donate=False)
    rows = meshlib.process_rows(mesh, BATCH)
    losses, dropped, times = [], [], []
    bad_loss0 = None
    if bad_rows:
        batch = np.random.default_rng([1234, 0]).integers(0, cfg.vocab_size, (BATCH, SEQ), dtype=np.int32)
        _, metrics = step_fn(state, meshlib.shard_batch(mesh, batch[:rows.stop - rows.start], BATCH))
        bad_loss0 = float(metrics["loss"])
    i = 0
    while args.forever or i < args.steps:
        batch = np.random.default_rng([1234, i]).integers(0, cfg.vocab_size, (BATCH, SEQ), dtype=np.int32)
        t0 = time.perf_counter()
        state, metrics = step_fn(state, meshlib.shard_batch(mesh, batch[rows], BATCH))
        losses.append(float(metrics["loss"]))
        dropped.append(int(metrics["dropped"]))
        times.append(time.perf_counter() - t0)
        if args.forever:
            print(json.dumps({"process": setup.process_id, "step": i, "loss": losses[-1]}), flush=True)
        i += 1

    host = meshlib.host_state(state["params"])
    if processes.is_writer() and args.out:
        flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(host)}
        np.savez(f"{args.out}.{transport}.npz", **flat)
    return {"losses": losses, "dropped": dropped, "mesh": dict(mesh.shape),
            "processes": setup.num_processes, "devices": jax.device_count(),
            "rows": [rows.start, rows.stop], "step_seconds": times, "bad_rows_loss0": bad_loss0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--transports", default="ragged,pooled")
    ap.add_argument("--expert", type=int, default=None)
    ap.add_argument("--capacity", type=float, default=4.0)  # = the largest expert axis: no drops
    ap.add_argument("--out", default=None)
    ap.add_argument("--forever", action="store_true")
    ap.add_argument("--bad-rows", action="store_true",
                    help="also evaluate step 0 with every process reading the first rows (a wrong slice)")
    args = ap.parse_args()

    setup = processes.init_distributed()
    results = {t: run(setup, args, t, bad_rows=args.bad_rows) for t in args.transports.split(",")}
    # Host-side agreement across processes: process 0's value everywhere; an AND of flags.
    results["agree"] = {"process0_value": processes.agree(setup.process_id + 7),
                        "all_true": processes.all_processes(True),
                        "one_false": processes.all_processes(setup.process_id != 1)}
    if processes.is_writer() and args.out:
        Path(args.out).write_text(json.dumps(results))
    processes.barrier("mesh_check_done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
