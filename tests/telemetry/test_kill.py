"""kill -9 of a writer mid-ingest: only complete segments remain, nothing acknowledged is lost."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marin_assets.telemetry import TelemetryStore

WORKER = str(Path(__file__).with_name("_writer_worker.py"))
STEPS_PER_FLUSH = 2000


@pytest.mark.slow
@pytest.mark.parametrize("acks_before_kill, delay_s", [(3, 0.0), (4, 0.017)])
def test_kill9_during_ingest_loses_at_most_the_segment_being_written(tmp_path, acks_before_kill, delay_s):
    root = str(tmp_path / "telemetry")
    proc = subprocess.Popen(
        [sys.executable, WORKER, root, "r1", str(STEPS_PER_FLUSH)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    acked = -1
    try:
        deadline = time.monotonic() + 120
        for _ in range(acks_before_kill):
            line = proc.stdout.readline()
            assert line, f"worker died early: {proc.stderr.read()}"
            acked = int(line)
            assert time.monotonic() < deadline
        time.sleep(delay_s + random.random() * 0.01)  # land somewhere inside a later flush
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # On a loaded host the kill can land after further flushes: their acks are still in the pipe.
    printed = [int(line) for line in proc.stdout.read().split()]
    last_ack = max([acked, *printed])

    store = TelemetryStore(root)
    problems = store.verify()
    # The only allowed damage: the last segment renamed into place before its index update.
    assert all("not in the index" in p for p in problems) and len(problems) <= 1, problems
    repaired = store.repair()
    assert store.verify() == []
    assert repaired.missing == []

    frame = store.query(run="r1")
    steps = sorted(set(frame["step"].to_list()))
    last = steps[-1]
    assert steps == list(range(last + 1))  # complete segments only: no gap, no torn tail
    assert acked <= last <= last_ack + STEPS_PER_FLUSH  # at most the segment in flight beyond the last ack
    assert (last + 1) % STEPS_PER_FLUSH == 0  # whole flushes only
    assert frame.height == 2 * (last + 1)  # both metrics of every step, each once
    a = frame.filter(metric="a")
    assert a["value"].to_list() == [float(s) for s in range(last + 1)]
    assert frame.filter(metric="b")["value"].to_list() == [-s / 2 for s in range(last + 1)]
    assert sum(s.rows for s in store.segments()) == frame.height
    # Whatever the kill left in staging is never listed as a segment.
    staging = Path(root, "_staging")
    leftovers = list(staging.iterdir()) if staging.exists() else []
    assert all(p.suffix == ".tmp" for p in leftovers) and len(leftovers) <= 1
