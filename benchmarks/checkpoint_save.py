"""Seconds to a durable checkpoint on 2 processes x 2 CPU devices (issue 25 item 4).

``checkpoint_save``: the same train-state-like pytree (``--mb`` MiB of float32: expert weights
[L, E, d, f] sharded on E over all four devices, dense weights sharded on their first axis over all
four devices as FSDP lays them out, and a few small replicated leaves) saved two ways, each timed
on process 0 from a barrier to the moment the COMMITTED marker is written and every process knows it:

- reference: every leaf all-gathered to every host (``mesh.host_state``), process 0 writes one
  ``state.npz`` (``checkpoint.save``), a barrier (what ``checkpointing.save`` did before sharding);
- ours: ``sharded_checkpoint.start_save(...).wait()``: each process writes the shards it owns
  through tensorstore, then the marker.

ratio = reference seconds / ours (> 1: sharded is faster). Each way runs once to warm up (the
all-gather compiles), then ``--repeats`` times alternating; the medians are reported. Both write
to a local disk with fsync.

    .venv/bin/python benchmarks/checkpoint_save.py [--mb 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from _common import emit  # noqa: E402


def state_of(mesh, mib: int) -> dict:
    """A pytree of about ``mib`` MiB laid out over ``mesh`` (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    all_devices = ("data", "expert")
    floats = mib * (1 << 20) // 4
    d = 256
    n_expert = floats // 2 // (2 * 8 * d * d)  # L=2 layers of 8 experts, [d, d] each
    n_dense_rows = floats // 2 // d
    shapes = {
        "experts": ((2, 8 * max(1, n_expert), d, d), P(None, all_devices)),
        "dense": ((max(4, n_dense_rows // 4 * 4), d), P(all_devices)),
        "norm": ((d,), P()),
        "step": ((), P()),
    }
    out = {}
    for i, (name, (shape, spec)) in enumerate(shapes.items()):
        sharding = NamedSharding(mesh, spec)
        make = jax.jit(
            lambda i=i, shape=shape: jax.random.normal(jax.random.PRNGKey(i), shape, jnp.float32), out_shardings=sharding
        )
        out[name] = make()
    return out


def worker(mib: int, repeats: int, root: str) -> None:
    """One process of the job: time both ways; process 0 prints the timings as one JSON line."""
    from marin_assets.train.distributed import hosts as distributed
    from marin_assets.train.distributed import mesh as meshlib

    distributed.init_distributed()
    import jax

    from marin_assets.train.checkpoints import checkpoint as ckpt
    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    mesh = meshlib.make_mesh(expert=2)
    state = state_of(mesh, mib)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
    step, counter = iter(range(1, 10_000)), {"n": 0}

    def gathered() -> None:
        host = meshlib.host_state(state)
        if distributed.is_writer():
            ckpt.save(f"{root}/gathered", next(step), host, {})
        else:
            next(step)
        distributed.barrier(f"bench-gathered-{counter['n']}")

    def sharded_save() -> None:
        sharded.start_save(f"{root}/sharded", next(step), state, {}).wait()

    def timed(fn) -> float:
        counter["n"] += 1
        distributed.barrier(f"bench-start-{counter['n']}")
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    timed(gathered), timed(sharded_save)  # warm-up: compiles, first files
    times = {"gathered": [], "sharded": []}
    for _ in range(repeats):
        times["gathered"].append(timed(gathered))
        times["sharded"].append(timed(sharded_save))
    if distributed.is_writer():
        print(json.dumps({"bytes": nbytes, **times}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64, help="MiB of state")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.mb, args.repeats, args.root)
        return
    from marin_assets.train.distributed import hosts as distributed

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=os.environ.get("TMPDIR")) as root:
        argv = [sys.executable, __file__, "--worker", "--mb", str(args.mb), "--repeats", str(args.repeats), "--root", root]
        procs = []
        for pid in range(2):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "MARIN_"))}
            env.update(distributed.local_env(pid, 2, port, 2), JAX_PLATFORMS="cpu")
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"checkpoint_save worker failed:\n{err[-3000:]}")
    timing = json.loads(outs[0][0].strip().splitlines()[-1])
    ours, reference = statistics.median(timing["sharded"]), statistics.median(timing["gathered"])
    emit(
        "checkpoint_save",
        "s",
        ours,
        reference,
        higher_is_better=False,
        processes=2,
        devices_per_process=2,
        state_mib=round(timing["bytes"] / (1 << 20), 1),
        sharded_s=timing["sharded"],
        gathered_s=timing["gathered"],
    )


if __name__ == "__main__":
    main()
