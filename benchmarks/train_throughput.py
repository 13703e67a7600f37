"""End-to-end training throughput vs the bare jitted step on the same shape.

ours:      tokens/s of ``marin_assets.train.loop.train`` (Feistel data loading from a real
           Levanter cache, the jitted step with guards, metrics.jsonl every step,
           permanent checkpoints every 50 steps), timed between the first and the last
           step's metrics callback so compilation is excluded.
reference: tokens/s of the same jitted step called in a bare Python loop on one
           pre-built batch (no data, no logging, no checkpoints).
ratio = ours / reference (target >= 0.9).

    python benchmarks/train_throughput.py [--config examples/tiny_moe.yaml] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def build_cache(path: Path) -> Path:
    from levanter.store.cache import SerialCacheWriter

    lib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    texts = []
    for f in sorted(lib.glob("*.py"))[:60]:
        texts += [p for p in f.read_text(errors="ignore").split("\n\n") if len(p) > 40]
    with SerialCacheWriter(str(path), {"input_ids": np.zeros((0,), np.int32)}) as w:
        for i in range(0, len(texts), 256):
            w.write_batch(
                [
                    {"input_ids": np.frombuffer(t.encode("utf-8", "ignore") + b"\0", np.uint8).astype(np.int32)}
                    for t in texts[i : i + 256]
                ]
            )
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny_moe.yaml"))
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()

    import jax

    from marin_assets.train.config import load_config, replace
    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import default_model, init_state, make_train_step, state_layout, train

    config = load_config(args.config)
    # A short run keeps the schedule valid (warmup + decay within total_steps); the LR does not change the step's cost.
    schedule = {
        "total_steps": args.steps,
        "warmup_steps": min(config.schedule.warmup_steps, args.steps // 4),
        "decay_steps": min(config.schedule.decay_steps, args.steps // 4),
    }
    config = replace(config, num_steps=args.steps, checkpoint_every_steps=50, checkpoint_every_seconds=3600.0, schedule=schedule)
    tmp = Path(tempfile.mkdtemp(prefix="marin-bench-"))
    cache = build_cache(tmp / "cache")

    stamps = []
    result = train(config, {"train": cache}, tmp / "out", resume=False, log_fn=lambda row: stamps.append(time.perf_counter()))
    ours = (len(stamps) - 1) * config.tokens_per_step / (stamps[-1] - stamps[0])

    model = default_model()
    mesh = meshlib.make_mesh(config.model)  # the same mesh train() builds
    opt, _, state_sh = state_layout(config, model, mesh)
    state = meshlib.init_sharded(lambda: init_state(config, opt, model), mesh, config.fsdp)
    step = make_train_step(config, opt, model, mesh, state_sh)
    rows = np.random.default_rng(0).integers(0, 256, (config.batch_size, config.seq_len)).astype(np.int32)
    tokens = meshlib.shard_batch(mesh, rows, config.batch_size)
    ok, lr = np.bool_(True), np.float32(config.schedule.peak_lr)
    state, m = step(state, tokens, ok, lr)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(args.steps - 1):
        state, m = step(state, tokens, ok, lr)
    jax.block_until_ready(m)
    reference = (args.steps - 1) * config.tokens_per_step / (time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "name": "train_loop",
                "unit": "tokens/s",
                "ours": round(ours, 1),
                "reference": round(reference, 1),
                "ratio": round(ours / reference, 3),
                "steps": args.steps,
                "batch": config.batch_size,
                "seq_len": config.seq_len,
                "device": str(jax.devices()[0].platform),
                "final_loss": result.last_loss,
                "checkpoint_every_steps": 50,
            }
        )
    )


if __name__ == "__main__":
    main()
