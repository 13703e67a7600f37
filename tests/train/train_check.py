"""``loop.train`` on the ("data", "expert") mesh the environment describes, run as a subprocess.

The environment says how many processes and devices (as the manifests do), because
XLA_FLAGS and jax.distributed must be set before JAX starts its backend. For each
transport it trains ``--steps`` steps of the tiny MoE on the test caches with capacity
factors equal to the expert axis size (nothing can drop), into ``--out/<transport>``;
every process calls ``train`` alike and process 0 writes the run's files.

  python -m tests.train.train_check --caches caches.json --out DIR --steps 20 --expert 4
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from marin_assets.train import mesh as meshlib
from tests.support.configs import TINY_TRAIN


def config(transport: str, steps: int, capacity: float):
    from marin_assets.train.config import config_from_dict

    model = dict(TINY_TRAIN["model"], ep_transport=transport, capacity_factor_send=capacity,
                 capacity_factor_recv=capacity)
    return config_from_dict(dict(TINY_TRAIN, model=model, num_steps=steps, batch_size=8, checkpoint_every_steps=10))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caches", required=True, help="JSON file: {source: cache dir}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--expert", type=int, required=True)
    ap.add_argument("--transports", default="ragged,pooled")
    args = ap.parse_args()

    meshlib.init_distributed()
    from marin_assets.train.loop import train

    caches = json.loads(Path(args.caches).read_text())
    for transport in args.transports.split(","):
        cfg = config(transport, args.steps, capacity=float(args.expert))
        mesh = meshlib.make_mesh(cfg.model, expert=args.expert)
        train(cfg, caches, Path(args.out) / transport, resume=False, mesh=mesh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
