"""Subprocess body for the store's multi-process tests.

Usage: python _worker.py PREFIX LOGFILE SLEEP_S
Materialises one fixed version; the compute step appends "computed" to LOGFILE, writes a
file in several chunks with a pause (so a test can kill it mid-write), and the process
prints "hit" or "computed" as its last line.
"""

import sys
import time

from marin_assets.store import ArtifactStore, LeaseConfig, compute_version

prefix, logfile, sleep_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = ArtifactStore(prefix, LeaseConfig(heartbeat_s=0.2, stale_after_s=1.0), poll_s=0.05)
version = compute_version("test/shared", "1", {"n": 1})


def compute(out_dir: str) -> dict:
    with open(logfile, "a") as log:
        log.write("computed\n")
    with open(f"{out_dir}/payload.bin", "wb") as f:
        for _ in range(10):
            f.write(b"x" * 1000)
            f.flush()
            time.sleep(sleep_s / 10)
    return {"bytes": 10_000}


result = store.materialize("test/shared", None, version, compute, {"test": True})
print("hit" if result.cache_hit else "computed", flush=True)
