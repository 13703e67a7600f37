"""A code location for the capacity admission test: one job that trains a stand-in model.

The op trains deterministically from its newest checkpoint (a numpy state, a fixed update per
step, each step's data drawn from a generator seeded by the step), so a run stopped at any
point and resumed from its checkpoint ends with the same arrays as one that never stopped.
At step ``hold_at`` it checkpoints and waits for ``<root>/release`` (a file the test writes):
the test decides when each run is mid-training and when it may finish.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
from dagster import Config, Definitions, OpExecutionContext, in_process_executor, job, op

CHECKPOINT_EVERY = 4
HOLD_TIMEOUT_S = 300.0


class TrainConfig(Config):
    root: str  # one folder per training: checkpoint, gate files, final arrays
    seed: int
    steps: int = 24
    hold_at: int = 8


def initial_state(seed: int) -> dict[str, np.ndarray]:
    """The stand-in model before step 0."""
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(size=(8, 8)), "m": np.zeros((8, 8))}


def train_step(state: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    """One deterministic update: momentum on a gradient of this step's own data."""
    x = np.random.default_rng(10_000 + step).normal(size=(8, 8))
    grad = np.tanh(state["w"] @ x) @ x.T / 8
    m = 0.9 * state["m"] + grad
    return {"w": state["w"] - 0.05 * m, "m": m}


def reference(seed: int, steps: int) -> dict[str, np.ndarray]:
    """The arrays of a training that is never stopped."""
    state = initial_state(seed)
    for step in range(steps):
        state = train_step(state, step)
    return state


def _save(root: Path, name: str, step: int, state: dict[str, np.ndarray]) -> None:
    tmp = root / f".{name}.tmp.npz"
    with open(tmp, "wb") as f:
        np.savez(f, step=step, **state)
    os.replace(tmp, root / f"{name}.npz")  # atomic: a kill leaves the previous checkpoint


def _resume(root: Path, seed: int) -> tuple[int, dict[str, np.ndarray]]:
    path = root / "checkpoint.npz"
    if not path.exists():
        return 0, initial_state(seed)
    with np.load(path) as ckpt:
        return int(ckpt["step"]), {"w": ckpt["w"], "m": ckpt["m"]}


def _hold(root: Path, run_id: str) -> None:
    (root / f"held-{run_id}").touch()
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while not (root / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{root}: never released")
        time.sleep(0.05)


@op
def train_model(context: OpExecutionContext, config: TrainConfig) -> None:
    root = Path(config.root)
    start, state = _resume(root, config.seed)
    (root / f"start-{context.run_id}.json").write_text(json.dumps({"start_step": start}))
    for step in range(start, config.steps):
        if step == config.hold_at and not (root / "release").exists():
            _save(root, "checkpoint", step, state)
            _hold(root, context.run_id)
        state = train_step(state, step)
        if (step + 1) % CHECKPOINT_EVERY == 0:
            _save(root, "checkpoint", step + 1, state)
    _save(root, "final", config.steps, state)


@job(executor_def=in_process_executor)  # the step in the run worker process: one process per run
def train():
    train_model()


defs = Definitions(jobs=[train])
