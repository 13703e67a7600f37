"""The training worker: one process of a (possibly multi-process) training phase.

    python -m marin_assets.train.worker --spec SPEC.json

SPEC (JSON object, every key required except ``warm_start``):
  config      TrainConfig as nested dicts (``config_to_dict`` / ``config_from_dict``)
  caches      {source name: Levanter cache dir} or one dir (named "train")
  out_dir     the phase's output dir (shared by all processes; only process 0 writes)
  resume      bool: continue from the newest valid checkpoint in out_dir
  warm_start  checkpoint or out dir to start from, or null

Environment: see marin_assets/train/mesh.py (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JOB_COMPLETION_INDEX, MARIN_PROCESS_OFFSET, MARIN_DEVICES_PER_PROCESS,
MARIN_EXPERT_PARALLEL, MARIN_HEARTBEAT_TIMEOUT_S, MARIN_INIT_TIMEOUT_S) and Dagster
Pipes' (DAGSTER_PIPES_CONTEXT, DAGSTER_PIPES_MESSAGES).

Process 0 opens Dagster Pipes (a no-op mock outside Dagster) and reports: log lines, one
custom message per step ``{"metrics": {...}}`` (the metrics.jsonl row), and at the end one
asset materialization whose metadata is the run's counts (final_step, tokens,
phase_start_step, last_loss, tokens_left, counts, data_position, ...): the contract of
marin_assets/orchestration/training_backends.py. SPEC may be a local path or an fsspec URL. Other processes report
nothing. Exit codes: 0 done, 2 bad spec, 1 anything else (the traceback is on stderr and,
on process 0, in the Pipes closed message).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("marin_assets.train.worker")

SPEC_KEYS = ("config", "caches", "out_dir", "resume", "warm_start", "telemetry_run", "telemetry_root")
OPTIONAL_KEYS = ("warm_start", "telemetry_run", "telemetry_root")
EXIT_BAD_SPEC = 2


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    config: Any  # TrainConfig
    caches: Mapping[str, str] | str
    out_dir: str
    resume: bool
    warm_start: str | None = None
    telemetry_run: str | None = None
    telemetry_root: str | None = None

    def __post_init__(self) -> None:
        from marin_assets.train.config import TrainConfig

        if not isinstance(self.config, TrainConfig):
            raise ValueError(f"spec.config must be a TrainConfig, got {type(self.config).__name__}")
        if isinstance(self.caches, Mapping):
            if not self.caches:
                raise ValueError("spec.caches is empty")
            for name, path in self.caches.items():
                if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
                    raise ValueError(f"spec.caches[{name!r}] must map a source name to a path string, got {path!r}")
        elif not isinstance(self.caches, str) or not self.caches:
            raise ValueError(f"spec.caches must be a mapping or a path string, got {self.caches!r}")
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError(f"spec.out_dir must be a non-empty string, got {self.out_dir!r}")
        if not isinstance(self.resume, bool):
            raise ValueError(f"spec.resume must be true or false, got {self.resume!r}")
        for name in OPTIONAL_KEYS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"spec.{name} must be a non-empty string or null, got {value!r}")


def spec_from_dict(data: Any, where: str = "spec") -> WorkerSpec:
    from marin_assets.train.config import config_from_dict

    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(SPEC_KEYS))
    missing = [k for k in SPEC_KEYS if k not in data and k not in OPTIONAL_KEYS]
    if unknown or missing:
        raise ValueError(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}; keys are {list(SPEC_KEYS)}")
    if not isinstance(data["config"], Mapping):
        raise ValueError(f"{where}.config: expected an object of TrainConfig fields, got {type(data['config']).__name__}")
    try:
        config = config_from_dict(data["config"], where=f"{where}.config")
    except (TypeError, AttributeError) as e:  # a field of the wrong type reached a dataclass
        raise ValueError(f"{where}.config: {e}") from None
    return WorkerSpec(config=config, caches=data["caches"], out_dir=data["out_dir"], resume=data["resume"],
                      **{k: data.get(k) for k in OPTIONAL_KEYS})


def spec_to_dict(spec: WorkerSpec) -> dict:
    from marin_assets.train.config import config_to_dict

    return {"config": config_to_dict(spec.config), "caches": spec.caches, "out_dir": spec.out_dir,
            "resume": spec.resume, **{k: getattr(spec, k) for k in OPTIONAL_KEYS}}


def load_spec(path: str | Path) -> WorkerSpec:
    """A spec from a local path or an fsspec URL (e.g. gs://...)."""
    import fsspec

    try:
        with fsspec.open(str(path), "r") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise ValueError(f"{path}: spec file not found") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    return spec_from_dict(data, where=str(path))


def result_metadata(result, mesh) -> dict:
    """The materialisation's metadata: the run's final counts (JSON-able values only)."""
    meta = {"final_step": result.final_step, "tokens": result.tokens, "counts": dict(result.counts),
            "data_position": result.data_position, "tokens_left": dict(result.tokens_left),
            "phase_start_step": result.phase_start_step, "metrics_path": str(result.metrics_path),
            "checkpoint_dir": str(result.checkpoint_dir) if result.checkpoint_dir else "",
            "mesh": {k: int(v) for k, v in mesh.shape.items()}, "devices": int(mesh.size),
            "stopped_by": result.stopped_by or ""}
    # Pipes infers scalars and strings; mappings (and a missing loss) must say what they are.
    typed = {k: {"raw_value": v, "type": "json"} if isinstance(v, Mapping) else v for k, v in meta.items()}
    typed["last_loss"] = ({"raw_value": None, "type": "null"} if result.last_loss is None
                          else float(result.last_loss))
    return typed


def run(spec: WorkerSpec, pipes=None) -> int:
    """Train the phase in this process; ``pipes``: the Pipes context on process 0, else None."""
    from marin_assets.train import mesh as meshlib
    from marin_assets.train.loop import train

    mesh = meshlib.make_mesh(spec.config.model)
    meshlib.check_fits(mesh, spec.config.model, spec.config.batch_size, spec.config.seq_len)

    def report(row: dict) -> None:
        if pipes is not None:
            pipes.report_custom_message({"metrics": row})

    if pipes is not None:
        pipes.log.info(f"training {spec.config.phase}: {spec.config.num_steps} steps on mesh {dict(mesh.shape)}")
    result = train(spec.config, spec.caches, spec.out_dir, resume=spec.resume, warm_start=spec.warm_start,
                   log_fn=report, mesh=mesh, telemetry_run=spec.telemetry_run, telemetry_root=spec.telemetry_root)
    if pipes is not None:
        pipes.log.info(result.stop_message if result.stopped_by else
                       f"done at step {result.final_step}, last loss {result.last_loss}")
        pipes.report_asset_materialization(metadata=result_metadata(result, mesh))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m marin_assets.train.worker", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the worker spec JSON file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = load_spec(args.spec)
    except ValueError as e:
        print(f"marin train worker: bad spec: {e}", file=sys.stderr)
        return EXIT_BAD_SPEC

    from marin_assets.train import mesh as meshlib

    setup = meshlib.init_distributed()  # before anything starts a JAX backend
    if setup.process_id != 0:
        return run(spec)
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:  # reports an exception raised inside to Dagster
        return run(spec, pipes)


if __name__ == "__main__":
    raise SystemExit(main())
