"""MoE token drops against context length, per transport and balancing setting (issue 24, context phases).

The hypothesis: at a fixed batch in tokens, a longer context puts fewer, longer sequences on each device,
and one sequence's tokens may route alike (one document, one topic), so the load that reaches an expert
from one device is lumpier than the batch-wide balance suggests and more assignments overflow its capacity.
This measures whether that happens at toy scale.

For each context length (tokens per batch held constant, ``--tokens-per-batch``) and each training setting,
a tiny MoE (8 routed experts, top-2) trains ``--steps`` steps through ``marin_assets.train.loop.train`` on one
device, on a byte-level cache of the standard library's Python sources. The trained model (params and router
bias from its final checkpoint) then routes the next ``--eval-batches`` batches of the same stream through
each expert-parallel transport (``ragged``, ``pooled``) on a ``--devices``-wide expert axis of host CPU
devices, with the default capacity factors and with higher ones; the figure is ``moe/drop_rate`` (dropped /
routed assignments over every layer, ``model/moe.moe_step_metrics``) over those batches. Settings:

  baseline   the model's default capacity factors (send 1.10, receive 1.15) and quantile balancing;
  high_cf    the baseline's model, both capacity factors raised to ``--high-cf`` (no retraining: capacity
             changes what is dropped, not what the router chose);
  seq_aux    trained with the sequence-wise auxiliary balance loss (``ModelConfig.sequence_balance_loss``,
             DeepSeek-V3's complementary sequence-wise loss) of ``--seq-aux`` on top of the baseline.

Training runs on one device (dropless) so the router's drops do not feed back into its own training; what is
measured is what each transport would drop for the router the setting produced.

Prints a table, then one JSON line per figure: ``moe_context/<transport>/<setting>/ctx<L>`` with
ours = kept fraction (1 - drop rate) and reference = the kept fraction of the baseline at the same
transport and context (for the baseline itself: at the shortest context), so ratio > 1 = fewer drops than
the reference; the raw drop rates ride along.

    .venv/bin/python benchmarks/moe_context.py [--contexts 64,128,256,512,1024] [--steps 60]

Measured once (2-core CPU, --contexts 64,256,1024 --steps 60 --eval-batches 2, one seed), drop rate at
context 64 / 256 / 1024: ragged baseline 0 / 1.6% / 4.2%, pooled baseline 0.4% / 3.7% / 7.7%; capacity
factors 1.5: ragged 0 / 0 / 0.5%, pooled 0 / 0 / 2.0%; sequence-wise loss 0.01: ragged 0.4% / 2.3% / 1.6%,
pooled 0.5% / 4.1% / 4.1%. Drops rose with context in both transports; the higher capacity factor cut them
most; the sequence-wise loss cut them at 1024 and was slightly above the baseline at 64 and 256 (two
evaluation batches of one seed: differences that small are not established).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from _common import DEMO_MODEL, emit  # noqa: E402

SETTINGS = ("baseline", "high_cf", "seq_aux")
TRANSPORTS = ("ragged", "pooled")


def model_config(args, setting: str) -> dict:
    """The tiny MoE: 8 routed experts (2 per device on 4), top-2, one shared expert."""
    model = dict(DEMO_MODEL, n_routed_experts=2 * args.devices, max_seq_len=max(args.contexts))
    return model | ({"sequence_balance_loss": args.seq_aux} if setting == "seq_aux" else {})


def trained(args, cache: Path, root: Path, context: int, setting: str):
    """(config, params, router bias, data position) after a short single-device run."""
    import jax

    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.config import config_from_dict
    from marin_assets.train.data.batches import DataPosition
    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import default_model, train

    config = config_from_dict(
        {
            "model": model_config(args, setting),
            "seq_len": context,
            "batch_size": args.tokens_per_batch // context,
            "num_steps": args.steps,
            "checkpoint_every_steps": args.steps,
            "schedule": {"kind": "wsd", "peak_lr": 3e-3, "warmup_steps": args.steps // 5, "decay_steps": args.steps // 5},
        }
    )
    name = f"{setting}-{context}"
    result = train(
        config,
        {"train": cache},
        root / name,
        resume=False,
        telemetry_root=str(root / "telemetry"),
        telemetry_run=name,
        mesh=meshlib.make_mesh(config.model, expert=1, devices=jax.devices()[:1]),
    )
    arrays, _ = ckpt.load(result.checkpoint_dir)
    model = default_model()
    params = ckpt.restore_like(
        jax.eval_shape(lambda: model.init_params(config.model, jax.random.PRNGKey(0))), arrays, "['params']"
    )
    bias = ckpt.restore_like(model.init_router_bias(config.model), arrays, "['router_bias']")
    return config, params, bias, DataPosition.from_json(result.data_position)


def drop_rate(args, cache: Path, config, params, bias, position, transport: str, capacity_factor: float | None) -> float:
    """moe/drop_rate of the trained model on the next ``args.eval_batches`` batches, over the expert axis."""
    import dataclasses

    import jax

    from marin_assets.model import forward
    from marin_assets.model.moe import moe_step_metrics
    from marin_assets.train.data.sources import open_sources, train_loader
    from marin_assets.train.distributed import mesh as meshlib

    cf = {} if capacity_factor is None else {"capacity_factor_send": capacity_factor, "capacity_factor_recv": capacity_factor}
    model = dataclasses.replace(config.model, ep_transport=transport, **cf)
    mesh = meshlib.make_mesh(model, expert=args.devices, devices=jax.devices()[: args.devices])
    ep = meshlib.expert_parallel(mesh, model)
    step = jax.jit(lambda p, t, b: moe_step_metrics(forward(p, t, model, b, ep)[1])["drop_rate"])
    loader, rates = train_loader(config, open_sources({"train": cache})), []
    for _ in range(args.eval_batches):
        rows, _, position = loader.next_batch(position)
        rates.append(float(step(params, meshlib.shard_batch(mesh, rows, config.batch_size), bias)))
    return statistics.fmean(rates)  # every batch routes the same number of assignments


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=lambda s: [int(v) for v in s.split(",")], default=[64, 128, 256, 512, 1024])
    ap.add_argument("--transports", type=lambda s: s.split(","), default=list(TRANSPORTS))
    ap.add_argument("--settings", type=lambda s: s.split(","), default=list(SETTINGS))
    ap.add_argument("--tokens-per-batch", type=int, default=4096)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--high-cf", type=float, default=1.5)
    ap.add_argument("--seq-aux", type=float, default=1e-2)
    args = ap.parse_args()
    for context in args.contexts:
        if args.tokens_per_batch % (context * args.devices):
            ap.error(
                f"--tokens-per-batch {args.tokens_per_batch} is not a multiple of context {context} x "
                f"{args.devices} devices (the batch is split over the devices)"
            )
    bad = sorted(set(args.settings) - set(SETTINGS)) + sorted(set(args.transports) - set(TRANSPORTS))
    if bad:
        ap.error(f"unknown settings/transports {bad}: settings are {SETTINGS}, transports {TRANSPORTS}")
    if "high_cf" in args.settings and "baseline" not in args.settings:
        ap.error("high_cf re-measures the baseline's trained model: --settings must include baseline")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from train_throughput import build_cache

    root = Path(tempfile.mkdtemp(prefix="marin-moe-context-"))
    cache = build_cache(root / "cache")
    rates = {}
    for context in args.contexts:
        for setting in [s for s in args.settings if s != "high_cf"]:
            model = trained(args, cache, root, context, setting)
            for transport in args.transports:
                rates[transport, setting, context] = drop_rate(args, cache, *model, transport, None)
                if setting == "baseline" and "high_cf" in args.settings:
                    rates[transport, "high_cf", context] = drop_rate(args, cache, *model, transport, args.high_cf)
    print(
        f"drop rate over {args.eval_batches} batches after {args.steps} training steps; {args.tokens_per_batch} tokens "
        f"per batch over {args.devices} devices"
    )
    print(f"{'transport':<10}{'setting':<10}" + "".join(f"{'ctx ' + str(c):>10}" for c in args.contexts))
    for t in args.transports:
        for s in args.settings:
            print(f"{t:<10}{s:<10}" + "".join(f"{rates[t, s, c]:>10.4f}" for c in args.contexts))
    for (t, s, c), rate in sorted(
        rates.items(), key=lambda item: (TRANSPORTS.index(item[0][0]), SETTINGS.index(item[0][1]), item[0][2])
    ):
        ref = rates[t, "baseline", args.contexts[0] if s == "baseline" else c] if "baseline" in args.settings else rate
        emit(
            f"moe_context/{t}/{s}/ctx{c}",
            "kept fraction",
            1.0 - rate,
            1.0 - ref,
            True,
            drop_rate=round(rate, 6),
            reference_drop_rate=round(ref, 6),
            tokens_per_batch=args.tokens_per_batch,
            steps=args.steps,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
