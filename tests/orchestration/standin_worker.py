"""A stand-in for ``python -m marin_assets.train.distributed.worker`` (helper H9 builds the real one).

It honours the same contract: reads ``--spec``, derives its process id from the manifest
environment with ``jax_distributed_args``, writes ``process-<id>.json`` (its view of the
job) into ``out_dir``, and from process 0 alone speaks Dagster Pipes: a log line, one
metrics message per step and the final report. It trains nothing.

Knobs for failure tests: STANDIN_FAIL_PROCESS=<id> makes that process print lines and
exit 3; STANDIN_SIGKILL_PROCESS=<id> makes that process SIGKILL itself while the others
hang (as if blocked in a collective); STANDIN_NO_REPORT=1 makes process 0 exit 0 without the final report;
STANDIN_JAX=1 really joins jax.distributed (gloo) and checks a psum over all devices.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from marin_assets.cluster.manifests import jax_distributed_args


def _jax_check(args: dict) -> int:
    devices = os.environ.get("MARIN_DEVICES_PER_PROCESS")
    if devices:  # before jax is imported, as the real worker does
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**args)
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    total = multihost_utils.process_allgather(jnp.ones(())).sum()
    return int(total) * 1000 + jax.device_count()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    spec = json.loads(Path(parser.parse_args().spec).read_text())
    args = jax_distributed_args(os.environ)
    pid = args["process_id"]
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    seen = {
        "args": args,
        "devices_per_process": os.environ.get("MARIN_DEVICES_PER_PROCESS"),
        "spec_keys": sorted(spec),
        "num_steps": spec["config"]["num_steps"],
        "pid": os.getpid(),
    }
    if os.environ.get("STANDIN_JAX") == "1":
        seen["jax"] = _jax_check(args)
    (out / f"process-{pid}.json").write_text(json.dumps(seen))
    if os.environ.get("STANDIN_FAIL_PROCESS") == str(pid):
        for i in range(60):
            print(f"standin process {pid} line {i}", flush=True)
        print(f"standin process {pid}: simulated crash", flush=True)
        return 3
    if os.environ.get("STANDIN_SIGKILL_PROCESS") is not None:
        if os.environ["STANDIN_SIGKILL_PROCESS"] == str(pid):
            peers = [out / f"process-{i}.json" for i in range(args["num_processes"])]
            deadline = time.monotonic() + 60
            while not all(p.exists() for p in peers) and time.monotonic() < deadline:
                time.sleep(0.05)  # die mid-run, once every peer is up
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)  # a peer of a dead process, stuck in its collective
    if pid != 0:
        return 0
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        steps = spec["config"]["num_steps"]
        pipes.log.info(f"standin: {args['num_processes']} processes, {steps} steps")
        for step in range(steps):
            pipes.report_custom_message({"metrics": {"step": step, "loss": 5.0 - 0.1 * step}})
        if os.environ.get("STANDIN_NO_REPORT") != "1":
            pipes.report_asset_materialization(
                metadata={
                    "final_step": steps,
                    "tokens": steps * 512,
                    "phase_start_step": 0,
                    "last_loss": 5.0 - 0.1 * (steps - 1),
                    "tokens_left": {"raw_value": {"sotu": 100}, "type": "json"},
                    "counts": {"raw_value": {"skipped_spike": 0, "grad_clipped": 2}, "type": "json"},
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
