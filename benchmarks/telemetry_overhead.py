"""What the per-step MoE telemetry costs the train loop (issue 24 item 1).

``telemetry_overhead``: seconds per step with the new telemetry (ours) and without it
(reference); ratio = without / with (the target is >= 0.97; > 1 is timing noise). "With":
the jitted step computes ``metrics["moe"]`` (``model.moe.moe_step_metrics``) and each row
gets its ``moe/...`` columns and, through ``emit.Throughput``, ``tokens_per_s`` and ``mfu``. "Without": ``make_train_step(...,
moe_telemetry=False)`` and ``host_row`` without a clock. Both sides run as the loop runs:
step i is dispatched, then row i-1 is fetched (one ``device_get``) and written to a
metrics.jsonl and a telemetry store (the emitter's work), then the store is flushed at the end
of each block. Blocks of ``--steps`` steps alternate between the sides (drift hits both); each
side's median seconds per step over its blocks is reported.

    .venv/bin/python benchmarks/telemetry_overhead.py [--config examples/tiny_moe.yaml] [--blocks 6] [--steps 20]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from _common import emit  # noqa: E402


class Side:
    """One variant: its jitted step, its own state, metrics file and telemetry store."""

    def __init__(self, config, telemetry: bool, out: Path, peak) -> None:
        import numpy as np

        from marin_assets.telemetry import TelemetryWriter
        from marin_assets.train.distributed import mesh as meshlib
        from marin_assets.train.emit import TELEMETRY_FLUSH_SECONDS, Throughput
        from marin_assets.train.metrics import MetricsLogger
        from marin_assets.train.restore import state_layout
        from marin_assets.train.state import init_state
        from marin_assets.train.step import default_model, make_train_step

        model = default_model()
        mesh = meshlib.make_mesh(config.model)
        opt, _, state_sh = state_layout(config, model, mesh)
        self.step_fn = make_train_step(config, opt, model, mesh, state_sh, moe_telemetry=telemetry)
        self.state = meshlib.init_sharded(lambda: init_state(config, opt, model), mesh, config.fsdp)
        rows = np.random.default_rng(0).integers(0, config.model.vocab_size, (config.batch_size, config.seq_len))
        self.tokens = meshlib.shard_batch(mesh, rows.astype(np.int32), config.batch_size)
        self.config, self.step = config, 0
        self.throughput = Throughput(peak) if telemetry else None
        name = "with" if telemetry else "without"
        self.logger = MetricsLogger(out / name)
        self.writer = TelemetryWriter(str(out / "telemetry"), name, flush_seconds=TELEMETRY_FLUSH_SECONDS)

    def run(self, steps: int) -> float:
        """Seconds per step over ``steps`` loop iterations, the last row written and the store flushed."""
        import numpy as np

        from marin_assets.train.emit import host_row

        ok, lr, pending = np.bool_(True), np.float32(1e-3), None
        start = time.perf_counter()
        for _ in range(steps):
            self.step += 1
            self.state, metrics = self.step_fn(self.state, self.tokens, ok, lr)
            self._write(pending)
            pending = functools.partial(
                host_row, self.step, metrics, self.config, self.step * self.config.tokens_per_step, throughput=self.throughput
            )
        self._write(pending)
        self.logger.flush()
        self.writer.flush()
        return (time.perf_counter() - start) / steps

    def _write(self, row_fn) -> None:
        from marin_assets.train.metrics import telemetry_fields

        if row_fn is None:
            return
        row = row_fn()
        self.logger.write(row)
        self.writer.log(row["step"], telemetry_fields(row), phase=row["phase"])

    def close(self) -> None:
        self.logger.close()
        self.writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny_moe.yaml"))
    ap.add_argument("--blocks", type=int, default=6, help="timed blocks per side (after one warm-up block)")
    ap.add_argument("--steps", type=int, default=20, help="steps per block")
    args = ap.parse_args()

    import jax

    from marin_assets.model.flops import peak_flops
    from marin_assets.train.config import load_config

    config = load_config(args.config)
    peak = peak_flops()  # before any step: a CPU's is measured
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"without": Side(config, False, Path(tmp), peak), "with": Side(config, True, Path(tmp), peak)}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for side in sides.values():
            side.run(3)  # compile and warm up
        for block in range(args.blocks):
            order = list(sides) if block % 2 == 0 else list(reversed(sides))
            for name in order:
                times[name].append(sides[name].run(args.steps))
        for side in sides.values():
            side.close()
    per_step = {name: statistics.median(t) for name, t in times.items()}
    shape = {
        "layers": config.model.n_layers,
        "d_model": config.model.d_model,
        "experts": config.model.n_routed_experts,
        "batch": config.batch_size,
        "seq_len": config.seq_len,
        "device": jax.devices()[0].platform,
        "blocks": args.blocks,
        "steps_per_block": args.steps,
    }
    # ratio = without / with: the figure itself (>= 0.97 is the target)
    emit("telemetry_overhead", "s/step", per_step["with"], per_step["without"], higher_is_better=False, **shape)


if __name__ == "__main__":
    main()
