"""Subprocess body for the kill -9 test: log forever, acknowledge each completed flush.

Usage: python _writer_worker.py ROOT RUN STEPS_PER_FLUSH
Step s logs {"a": s, "b": -s / 2}; after each flush it prints the last step that flush
wrote, so the parent knows what must survive a kill.
"""

import sys

from marin_assets.telemetry import TelemetryWriter

root, run, steps_per_flush = sys.argv[1], sys.argv[2], int(sys.argv[3])
writer = TelemetryWriter(root, run, flush_rows=2 * steps_per_flush, flush_seconds=1e9)
step = 0
while True:
    writer.log(step, {"a": float(step), "b": -step / 2}, time=1_000_000.0 + step)
    if step % steps_per_flush == steps_per_flush - 1:
        print(step, flush=True)  # this step's flush has returned: its segment is durable
    step += 1
