"""``marin plan comm --config FILE [--json]``: per-GPU, per-layer communication of a MoE config's routed experts.

Reads a training config (YAML with a ``model:`` block, e.g. examples/marin_535b_a23b.yaml) and prints the
parameter counts (``jax.eval_shape`` over the model's init, nothing allocated), the training state, and the
bytes one GPU moves per layer under FSDP over the experts (weights) and under expert parallelism
(activations), for the config's expert layout, the same without a latent projection, and a coarser layout;
the formulas are in ``marin_assets.cluster.comm_plan``. ``--json`` prints one JSON object, otherwise a table.
Exit codes: 0 planned, 2 a bad flag or config (one line naming it).
"""

from __future__ import annotations

import argparse
import json
import sys

from marin_assets.cli._types import finite_float
from marin_assets.knobs import add_flags, from_flags
from marin_assets.train.config import load_config

_KNOBS = ["tokens_per_gpu", "bytes_per_value", "state_bytes_per_param", "granularity"]


def register(subparsers) -> None:
    from marin_assets.cluster.comm_plan import CommPlanConfig  # deferred (import cost): jax

    parser = subparsers.add_parser("plan", help="Plan a model's distributed layout (communication per GPU and layer).")
    sub = parser.add_subparsers(dest="plan_command", metavar="SUBCOMMAND")
    comm = sub.add_parser("comm", help="FSDP-over-experts weight traffic vs expert-parallel activation traffic.")
    comm.add_argument("--config", required=True, help="training config YAML with a model: block")
    comm.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    add_flags(comm, CommPlanConfig, _KNOBS, float_type=finite_float)
    comm.set_defaults(handler=_comm)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 0)[1])


def _comm(args: argparse.Namespace) -> int:
    from marin_assets.cluster.comm_plan import CommPlanConfig, plan_comm  # deferred (import cost): jax

    try:
        config = from_flags(args, CommPlanConfig)
        train_config = load_config(args.config, check_memory=False)  # its errors name the file; a shape to plan
    except (ValueError, OSError) as exc:
        return _refuse(str(exc))
    try:
        report = plan_comm(train_config.model, config, train_config.seq_len)
    except ValueError as exc:
        return _refuse(f"{args.config}: {exc}")
    report = {"config": args.config, **report}
    print(json.dumps(report) if args.json else render_table(report))
    return 0


def _refuse(why: str) -> int:
    print(f"marin plan comm: {why}", file=sys.stderr)
    return 2


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (20.25 GiB, 48.00 KiB)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:g} B"


def render_table(report: dict) -> str:
    """The human form of ``plan_comm``'s report: one row per layout, then parameters, state and ratios."""
    head = f"{'layout':<15}{'experts':>8}{'top_k':>6}{'d_ff':>6}{'routed':>7}{'FSDP weights':>14}{'EP activations':>16}"
    lines = [f"per GPU per layer, forward pass, {report['config']}", head]
    for name, row in report["layouts"].items():
        if row is None:
            continue
        lines.append(
            f"{name:<15}{row['n_experts']:>8}{row['top_k']:>6}{row['expert_d_ff']:>6}{row['routed_dim']:>7}"
            f"{_size(row['fsdp_weight_bytes']):>14}{_size(row['ep_activation_bytes']):>16}"
        )
    p, a, r = report["params"], report["assumptions"], report["ratios"]
    lines += [
        f"params: total {p['total']:,}, active {p['active']:,} (without embedding and LM head), "
        f"{p['active_with_vocab']:,} with them [{p['source']}]",
        f"training state: {_size(report['training_state_bytes'])} at {a['state_bytes_per_param']:g} bytes/param",
        f"FSDP / EP: {r['fsdp_over_ep']:.3f}; latent / no latent (EP): {r['latent_over_no_latent_ep']:.3f}",
        f"assumed: {a['tokens_per_gpu']} tokens per GPU, {a['bytes_per_value']:g} bytes per value",
    ]
    if r["config_over_coarser_ep"] is not None:
        lines.append(f"config / {a['granularity']}x coarser (EP): {r['config_over_coarser_ep']:.3f}")
    att = report["attention"]
    window = f" + {att['sliding_layers']} sliding-window ({att['window']})" if att["sliding_layers"] else ""
    lines.append(
        f"attention at seq_len {att['seq_len']}: {att['global_layers']} global{window} layers; FLOPs/token and KV per "
        f"sequence ({_size(att['kv_bytes_per_sequence'])}) x{att['pattern_over_all_global']:.3f} of all-global"
    )
    return "\n".join(lines + [f"note: {note}" for note in report["notes"]])
