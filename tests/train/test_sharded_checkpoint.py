"""Sharded checkpoints across processes (``sharded_checkpoint.py``): on 2 processes x 2 devices each
process writes its own shards and the marker comes after both; the checkpoint restores onto 1 x 4 and
1 x 1 and trains on with the same losses; a process killed with SIGKILL
while a save is being written leaves the previous checkpoint the newest valid one, and training went
on during that save. On the GCS emulator: tests/gcs/test_sharded_checkpoint_on_gcs.py.

Run as a script (every process of a layout, with the manifests' environment):

  python -m tests.train.test_sharded_checkpoint --caches caches.json --out DIR --steps 12 --expert 2 [--resume]
      [--slow-process P]   process P sleeps before writing its shards (the marker must wait for it)
      [--pause-at-step S]  the save of step S writes its shards, then never commits (killed there)
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.metrics import read_metrics
from tests.support.configs import TINY_TRAIN
from tests.train.test_mesh import PROC_TIMEOUT_S, finish
from tests.train.test_mesh import launch_argv as launch

SCRIPT = "tests.train.test_sharded_checkpoint"
STEPS, EVERY = 12, 6
CAPACITY = 4.0  # capacity factor >= the largest expert axis: nothing drops on any mesh


def config(steps: int, every: int):
    from marin_assets.train.config import config_from_dict

    model = dict(TINY_TRAIN["model"], capacity_factor_send=CAPACITY, capacity_factor_recv=CAPACITY)
    return config_from_dict(dict(TINY_TRAIN, model=model, num_steps=steps, batch_size=8, checkpoint_every_steps=every))


def _slow_writes(seconds: float) -> None:
    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    real = sharded._write_pieces

    def slow(*args):
        time.sleep(seconds)
        return real(*args)

    sharded._write_pieces = slow


def _never_commit_at(step: int) -> None:
    """The save of ``step`` writes its shards and manifest, says so, then hangs before the marker."""
    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    real = sharded._commit

    def hang(folder, meta):
        if meta["step"] != step:
            return real(folder, meta)
        print("PAUSED", flush=True)
        threading.Event().wait()

    sharded._commit = hang


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caches", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--every", type=int, default=EVERY)
    ap.add_argument("--expert", type=int, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--slow-process", type=int)
    ap.add_argument("--pause-at-step", type=int)
    args = ap.parse_args()

    from marin_assets.train.distributed import hosts as distributed
    from marin_assets.train.distributed import mesh as meshlib

    distributed.init_distributed()
    import jax

    from marin_assets.train.loop import train

    if args.slow_process == jax.process_index():
        _slow_writes(4.0)
    if args.pause_at_step is not None:
        _never_commit_at(args.pause_at_step)
    cfg = config(args.steps, args.every)
    caches = json.loads(Path(args.caches).read_text())
    train(
        cfg,
        caches,
        args.out,
        resume=args.resume,
        mesh=meshlib.make_mesh(cfg.model, expert=args.expert),
        log_fn=lambda row: print(f"STEP {row['step']} {row['loss']!r}", flush=True),
    )
    return 0


# -- the tests ------------------------------------------------------------------------------------


def argv(caches_json: Path, out: Path, expert: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", SCRIPT, "--caches", str(caches_json), "--out", str(out), "--expert", str(expert), *extra]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl")}


@pytest.fixture(scope="module")
def caches_json(caches, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sharded") / "caches.json"
    path.write_text(json.dumps({k: str(v) for k, v in caches.items()}))
    return path


def watch_commit(folder: Path, procs: list[subprocess.Popen]) -> dict:
    """Poll ``folder`` while the run writes it: whether process 0's manifest was ever seen before
    process 1's, and whether the marker was there at that moment."""
    seen = {"p0_before_p1": False, "marker_then": None}
    deadline = time.monotonic() + PROC_TIMEOUT_S
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if (folder / "COMMITTED").exists():
            break
        if (folder / "shards" / "process-00000.json").exists() and not (folder / "shards" / "process-00001.json").exists():
            seen["p0_before_p1"] = True
            seen["marker_then"] = (folder / "COMMITTED").exists()
        time.sleep(0.02)
    return seen


@pytest.fixture(scope="module")
def two_by_two(caches_json, tmp_path_factory) -> dict:
    """A 2 x 2 run of STEPS steps (checkpoints at EVERY and STEPS); process 1 writes its shards late."""
    out = tmp_path_factory.mktemp("sharded") / "2x2"
    procs = launch(2, 2, argv(caches_json, out, 2, "--slow-process", "1"))
    seen = watch_commit(out / "checkpoints" / f"step-{EVERY:09d}", procs)
    finish(procs, PROC_TIMEOUT_S)
    return {"out": out, "seen": seen}


@pytest.mark.slow
def test_each_process_writes_its_own_shards_and_the_marker_comes_last(two_by_two):
    out, seen = two_by_two["out"], two_by_two["seen"]
    folder = out / "checkpoints" / f"step-{EVERY:09d}"
    assert seen == {"p0_before_p1": True, "marker_then": False}  # process 1 was still writing: no marker yet
    assert ckpt.marker_problem(folder) is None and not (folder / "state.npz").exists()
    manifests = [json.loads((folder / "shards" / f"process-{p:05d}.json").read_text())["files"] for p in (0, 1)]
    chunks = [{f for f in m if not f.endswith(".zarray")} for m in manifests]
    assert chunks[0] and chunks[1] and not chunks[0] & chunks[1]  # both wrote, nothing twice
    meta = json.loads((folder / "meta.json").read_text())
    experts = [i for i, k in enumerate(meta["keys"]) if k.endswith("['e_up']") and k.startswith("['params']")]
    assert experts and all(meta["chunks"][i][1] * 2 == meta["shapes"][i][1] for i in experts)  # split on E
    marker_time = (folder / "COMMITTED").stat().st_mtime_ns
    written = [p for p in folder.rglob("*") if p.is_file() and p.name != "COMMITTED"]
    assert max(p.stat().st_mtime_ns for p in written) <= marker_time


@pytest.mark.slow
def test_a_2x2_checkpoint_restores_onto_1x4_and_1x1_and_trains_on(two_by_two, caches_json, tmp_path):
    source = two_by_two["out"] / "checkpoints" / f"step-{EVERY:09d}"
    reference = losses(two_by_two["out"])
    assert sorted(reference) == list(range(1, STEPS + 1))
    report = {}
    # the same mesh (2 x 2) resumes bit-exact: test_train_mesh.py's killed-and-resumed worker run checks that
    for name, (n_proc, devices, expert) in {"1x4": (1, 4, 4), "1x1": (1, 1, 1)}.items():
        out = tmp_path / name
        shutil.copytree(source, out / "checkpoints" / source.name)
        finish(launch(n_proc, devices, argv(caches_json, out, expert, "--resume")), PROC_TIMEOUT_S)
        got = losses(out)
        assert sorted(got) == list(range(EVERY + 1, STEPS + 1)), name  # resumed at the checkpoint's step
        diff = [abs(got[s] - reference[s]) for s in sorted(got)]
        report[name] = [float(f"{d:.1e}") for d in diff]
        assert diff[0] <= 1e-6 and max(diff) <= 1e-4, (name, diff)
    print(json.dumps({"abs_loss_diff_vs_2x2_after_restore": report}))


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.strip())


@pytest.mark.slow
def test_kill_dash_nine_mid_save_keeps_the_previous_checkpoint(caches_json, tmp_path):
    out, every, pause_at = tmp_path / "run", 4, 8
    proc = launch(1, 1, argv(caches_json, out, 1, "--steps", "24", "--every", str(every), "--pause-at-step", str(pause_at)))[0]
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    printed, paused, deadline = {}, False, time.monotonic() + PROC_TIMEOUT_S
    try:
        while not (paused and max(printed, default=0) >= pause_at + 2):  # the save hangs, training goes on
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            paused = paused or line == "PAUSED"
            if line.startswith("STEP "):
                _, step, loss = line.split()
                printed[int(step)] = float(loss)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    torn = out / "checkpoints" / f"step-{pause_at:09d}"
    assert (torn / "shards" / "process-00000.json").exists() and not (torn / "COMMITTED").exists()
    assert ckpt.latest_valid(out / "checkpoints").name == f"step-{every:09d}"
    finish(launch(1, 1, argv(caches_json, out, 1, "--steps", "24", "--every", str(every), "--resume")), PROC_TIMEOUT_S)
    resumed = losses(out)
    assert sorted(resumed) == list(range(1, 25))
    assert all(resumed[s] == printed[s] for s in printed if s > every)  # recomputed from step 4: bit-exact
    assert ckpt.latest_valid(out / "checkpoints").name == f"step-{24:09d}"


if __name__ == "__main__":
    raise SystemExit(main())
