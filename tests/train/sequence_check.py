"""Context parallelism in training, on 4 host devices, run as a subprocess (XLA_FLAGS must be set before JAX
starts): prints one JSON object.

``steps``: one train step (``train_step_for``, the step ``train`` runs) of a 2-layer tiny MoE with document
masking, per-document RoPE and a sliding window on one layer of two, from the same initial state on the same
batch (documents crossing the chunk boundaries), on meshes ``DATAxSEQUENCExEXPERT`` 1x1x1 (one device, the
reference), 1x4x1, 1x2x2, 2x2x1 and 4x1x1 (rows alone split: what any split does to the rounding). Per
layout, the largest |difference| from the reference of the params after the step, the gradient and the loss,
and the all-gathers in the compiled step (the keys and values gathered along the sequence axis).

``resume``: ``loop.train`` on the license cache (newline as EOS), 4 steps with a checkpoint every 2, on 1x4x1
in one go (``whole``); the same killed after step 3 and resumed from its step-2 checkpoint on 1x4x1 (``same``:
the split it was written on) and on 4x1x1 (``moved``: no sequence split, the rows over 4 data devices). Per
resumed run, the largest |difference| of its final params and of its steps' losses from ``whole``'s.
``context``: a phase of twice the length warm-started from ``whole`` that raises the sequence axis to 4.
``held_out``: the held-out loss (document-masked, newline as EOS) of one initial state on the license cache,
on 1x1x1 and on 1x4x1 (its positions split over the sequence axis), and the all-gathers of each compiled
held-out step.

  python -m tests.train.sequence_check --caches caches.json --out DIR
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from tests.support.configs import TINY_TRAIN  # noqa: E402
from tests.train.train_check import final_state_hook, max_abs_diff, one_step  # noqa: E402

SEQ = 64
BATCH = 8
LAYOUTS = ("1x1x1", "1x4x1", "1x2x2", "2x2x1", "4x1x1")  # the last: rows alone split, the control
NEWLINE = 10  # the byte caches' id of "\n": the stand-in EOS of the resume runs' documents
DOCS = [11, 30, 5, 18]  # row 0's documents: they cross the 16-token chunks of a 4-way split


def config(sequence: int, **changes):
    from marin_assets.train.config import config_from_dict

    model = dict(
        TINY_TRAIN["model"],
        n_layers=2,
        max_seq_len=SEQ,
        attention_impl="blockwise",
        rope_per_document=True,
        sliding_window=24,
        global_attention_every=2,
        capacity_factor_send=4.0,  # = the expert count: nothing can drop, whatever the split
        capacity_factor_recv=4.0,
    )
    base = dict(TINY_TRAIN, model=model, seq_len=SEQ, batch_size=BATCH, sequence_parallel=sequence, document_masking=True)
    return config_from_dict(base | changes)


def layout_mesh(name: str, model_config):
    import jax

    from marin_assets.train.distributed import mesh as meshlib

    data, sequence, expert = (int(x) for x in name.split("x"))
    return meshlib.make_mesh(model_config, expert=expert, devices=jax.devices()[: data * sequence * expert], sequence=sequence)


def masked_batch():
    from marin_assets.train.data.batches import MaskedRows

    rng = np.random.default_rng([1234, 2])
    tokens = rng.integers(0, TINY_TRAIN["model"]["vocab_size"] - 1, (BATCH, SEQ), dtype=np.int32)
    segments = np.zeros((BATCH, SEQ), np.int32)
    segments[0] = np.repeat(np.arange(len(DOCS)), DOCS)
    segments[3, SEQ // 2 :] = 1
    return MaskedRows(tokens, np.ones((BATCH, SEQ), np.int32), segments)


def all_gathers(cfg, mesh) -> int:
    """All-gathers in the compiled step on ``mesh``."""
    import jax

    from marin_assets.train.loop import default_model, make_train_step, state_layout

    model = default_model()
    opt, state, state_sh = state_layout(cfg, model, mesh)
    step = make_train_step(cfg, opt, model, mesh, state_sh)
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), masked_batch())
    scalars = (jax.ShapeDtypeStruct((), np.bool_), jax.ShapeDtypeStruct((), np.float32))
    hlo = step.lower(state, batch, *scalars).compile().as_text()
    return len(re.findall(r" all-gather(?:-start)?\(", hlo))


def steps() -> dict:
    out, reference = {}, None
    batch = masked_batch()
    for name in LAYOUTS:
        sequence = int(name.split("x")[1])
        cfg = config(sequence)
        mesh = layout_mesh(name, cfg.model)
        params, grads, metrics = one_step(cfg, batch, mesh)
        if reference is None:
            reference = (params, grads, metrics)
            out[name] = {"loss": metrics["loss"]}
            continue
        out[name] = {
            "params": max_abs_diff(params, reference[0]),
            "gradient": max_abs_diff(grads, reference[1]),
            "loss": abs(metrics["loss"] - reference[2]["loss"]),
            "dropped": metrics["dropped"],
        }
    for name in ("1x1x1", "1x4x1"):
        sequence = int(name.split("x")[1])
        out[name]["all_gathers"] = all_gathers(config(sequence), layout_mesh(name, config(sequence).model))
    out["1x4x1 fsdp"] = fsdp_step(batch, reference)
    return out


def fsdp_step(batch, reference) -> dict:
    """The 1x4x1 step with FSDP: the differences from one device, and each layout's largest per-device state."""
    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import default_model, state_layout

    cfg = config(4, fsdp=True)
    mesh = layout_mesh("1x4x1", cfg.model)
    params, grads, metrics = one_step(cfg, batch, mesh)
    _, state, _ = state_layout(cfg, default_model(), mesh)
    held = {f: meshlib.per_device_bytes(state, meshlib.state_shardings(mesh, state, fsdp=f)) for f in (False, True)}
    return {
        "params": max_abs_diff(params, reference[0]),
        "gradient": max_abs_diff(grads, reference[1]),
        "loss": abs(metrics["loss"] - reference[2]["loss"]),
        "state_bytes_per_device": held[True],
        "state_bytes_per_device_without_fsdp": held[False],
    }


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): float(r["loss"]) for r in rows if "loss" in r}  # a step run again: its last row


def eos_cache(caches: dict, out: Path) -> dict[str, str]:
    """The license cache as a DataKit cache folder whose stats.json names a stand-in EOS id (the newline's
    byte): document masking reads its documents' ends from it."""
    root = out / "license_eos"
    shutil.copytree(caches["license"], root / "train")
    (root / "stats.json").write_text(json.dumps({"tokenizer": {"eos_id": NEWLINE, "sha256": "bytes"}}))
    return {"license": str(root)}


def resume(caches: dict, out: Path) -> dict:
    from marin_assets.train.loop import train

    caches = eos_cache(caches, out)

    def run(name: str, layout: str, **options):
        schedule = dict(TINY_TRAIN["schedule"], warmup_steps=1, decay_steps=1)
        cfg = config(int(layout.split("x")[1]), num_steps=4, checkpoint_every_steps=2, schedule=schedule)
        hooks = final_state_hook(out / name, "ragged", None)
        return train(cfg, caches, out / name, mesh=layout_mesh(layout, cfg.model), hooks=hooks, **options)

    run("whole", "1x4x1")
    run("cut", "1x4x1", stop_at_step=3)  # killed after step 3 (no checkpoint there): the one at step 2 stays
    shutil.copytree(out / "cut", out / "same")
    shutil.copytree(out / "cut", out / "moved")
    report = {}
    whole = dict(np.load(f"{out / 'whole'}.params.npz"))
    for name, layout in (("same", "1x4x1"), ("moved", "4x1x1")):
        checkpoints = sorted(p.name for p in (out / name / "checkpoints").iterdir())
        result = run(name, layout)
        params = dict(np.load(f"{out / name}.params.npz"))
        mine, theirs = losses(out / name), losses(out / "whole")
        report[name] = {
            "layout": layout,
            "checkpoints_before": checkpoints,
            "final_step": result.final_step,
            "params": max(float(np.max(np.abs(params[k] - whole[k]))) for k in whole),
            "losses": max(abs(mine[s] - theirs[s]) for s in (3, 4)),
        }
    report["context"] = context_phase(caches, out)
    return report


def context_phase(caches: dict, out: Path) -> dict:
    """A context phase of twice ``whole``'s length that raises the sequence axis to 4 (``PhaseSpec.sequence_parallel``),
    warm-started from ``whole``, on the mesh ``train`` builds from its config."""
    from marin_assets.phases.plan import PhaseSpec, phase_train_config
    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import train

    base = config(1, schedule=dict(TINY_TRAIN["schedule"], warmup_steps=1, decay_steps=1))
    spec = PhaseSpec(
        name="long",
        warm_start_from="whole",
        schedule="wsd",
        mixture={"license": 1.0},
        batch_size=BATCH,
        hardware="cpu",
        token_budget=2 * BATCH * SEQ,
        peak_lr=3e-3,
        seq_len=2 * SEQ,
        sequence_parallel=4,
        model_changes={"max_seq_len": 2 * SEQ},
    )
    cfg = phase_train_config(base, spec)
    result = train(cfg, caches, out / "long", warm_start=out / "whole")
    return {
        "seq_len": cfg.seq_len,
        "sequence_parallel": cfg.sequence_parallel,
        "phase_start_step": result.phase_start_step,
        "final_step": result.final_step,
        "last_loss": result.last_loss,
        "mesh": dict(meshlib.train_mesh(cfg).shape),  # the mesh train built from the config
    }


def held_out(caches: dict) -> dict:
    """The held-out loss of one initial state on one device and on a 4-way sequence split (the license cache's
    windows, newlines as the documents' ends)."""

    from marin_assets.train.data.batches import MaskedRows
    from marin_assets.train.data.heldout import held_out_batches, held_out_step, validation_loss
    from marin_assets.train.distributed import mesh as meshlib
    from marin_assets.train.loop import default_model, init_state, state_layout

    model, out = default_model(), {}
    for name in ("1x1x1", "1x4x1"):
        cfg = config(int(name.split("x")[1]))
        mesh = layout_mesh(name, cfg.model)
        opt, _, _ = state_layout(cfg, model, mesh)
        state = meshlib.init_sharded(lambda c=cfg, o=opt: init_state(c, o, model), mesh)
        caches = {"license": caches["license"]}
        loss = validation_loss(cfg, model, state, caches, mesh, eos_ids={"license": NEWLINE})
        step, where = held_out_step(cfg, model, mesh)
        batch = held_out_batches(caches, cfg.seq_len, cfg.batch_size, eos_ids={"license": NEWLINE})[0]
        assert isinstance(batch, MaskedRows)
        placed = batch._make(None if x is None else meshlib.place_state(x, where) for x in batch)
        hlo = step.lower(state.params, state.router_bias, placed).compile().as_text()
        out[name] = {"loss": loss, "all_gathers": len(re.findall(r" all-gather(?:-start)?\(", hlo))}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caches", required=True, help="JSON {source: cache dir}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    caches = json.loads(Path(args.caches).read_text())
    report = {"steps": steps(), "resume": resume(caches, Path(args.out)), "held_out": held_out(caches)}
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
