"""``marin export``: a trained model out of the lab.

hf CKPT OUT   write a ``marin train`` checkpoint (a checkpoint folder or a run's out dir: its newest) as a
              Hugging Face model folder (config.json, model.safetensors, generation_config.json, the
              tokenizer files, README.md) in the llama / qwen3 layout (dense) or mixtral / qwen3_moe (MoE),
              chosen from the config unless ``--layout``. A config with no exact counterpart in the layout
              (shared experts, a latent projection, partial RoPE, sigmoid gating, a nonzero router bias) is
              refused, naming the field.

Prints one JSON line. Exit codes: 0 written, 2 a refused config, a bad flag, checkpoint or out folder.
"""

from __future__ import annotations

import argparse
import json
import sys

from marin_assets.train.checkpoints.work_dir import work_dir_lease


def register(subparsers) -> None:
    parser = subparsers.add_parser("export", help="Export a checkpoint (e.g. as a Hugging Face model folder).")
    sub = parser.add_subparsers(dest="export_command", metavar="SUBCOMMAND")
    h = sub.add_parser("hf", help="Write a checkpoint as a Hugging Face model folder (exact layouts only).")
    h.add_argument("checkpoint", help="a marin train out dir (its newest checkpoint) or a checkpoint folder")
    h.add_argument("out", help="a new (or empty) folder or fsspec URL to write the model to")
    h.add_argument(
        "--layout",
        default="auto",
        choices=("auto", "llama", "qwen3", "mixtral", "qwen3_moe"),
        help="the HF layout (default: llama/qwen3 for dense, mixtral/qwen3_moe for MoE, by qk_norm)",
    )
    h.add_argument(
        "--tokenizer",
        default=None,
        help="the training data's tokenizer (a name or tokenizer.json); default: the byte tokenizer "
        "when that is what the checkpoint recorded",
    )
    h.add_argument(
        "--shard-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="largest safetensors file; past it the weights are sharded with an index (default 2 GiB)",
    )
    h.set_defaults(handler=_hf)


def _hf(args: argparse.Namespace) -> int:
    from marin_assets.hf import export_hf  # deferred (import cost): jax, optax
    from marin_assets.hf.weights import DEFAULT_SHARD_BYTES  # deferred (import cost): jax, optax

    try:
        with work_dir_lease(args.out, "marin export hf"):  # two exports into one empty folder would interleave
            result = export_hf(
                args.checkpoint,
                args.out,
                args.layout,
                tokenizer=args.tokenizer,
                shard_bytes=DEFAULT_SHARD_BYTES if args.shard_size is None else args.shard_size,
            )
    except (ValueError, FileNotFoundError) as exc:
        print(f"marin export hf: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
