"""A branch leaves the main run as it was, byte for byte: the main run trained for real (the train/demo asset,
the local backend, a tiny MoE on two byte-level datasets), driven by the phase controller, once without and
once with two branches off its first phase: an early cooldown, and an SFT branch on the chat dataset the real
datasets/shakespeare_chat asset makes from the plays (loss on the replies only)."""

import dataclasses
import json
from itertools import pairwise
from pathlib import Path

import dagster as dg
import pytest

from assets.datakit.chat import CHAT_SOURCE, shakespeare_chat
from assets.datakit.datasets import mixture_asset
from assets.datakit.inputs import tokenizer_asset
from assets.partitions import demo_phases as phases
from assets.training import TRAIN_KEY, train_phase
from marin_assets.orchestration import ArtifactIOManager, ArtifactStoreResource
from marin_assets.orchestration.training_backends import LocalTrainingBackend
from marin_assets.phases.plan import BranchSpec, PhasePlan
from marin_assets.train.budget import Budget, write_budget
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.metrics import read_metrics
from marin_assets.train.restore import resolve_checkpoint
from sensors.phase_controller import phase_controller_sensor
from tests.orchestration.phase_job import BASE, MIXTURE_CONFIG, TOKENS_PER_STEP, phase_spec
from tests.support.datasets import byte_datasets
from tests.support.plays import FOLIO_PLAY, MODERN_PLAY

# The main run's two datasets (sotu, and plays for shakespeare: one held out), the byte tokenizer, the chat
# dataset made from the plays, and the mixture over all three (the chat dataset at weight 0, as in the code location).
DATA = [
    *byte_datasets(
        {
            "sotu": ([json.__doc__] * 6, []),
            "shakespeare": ([MODERN_PLAY.replace("Wren", name) for name in ("Wren", "Ash", "Rook")], [FOLIO_PLAY]),
        }
    ),
    tokenizer_asset("bytes"),
    shakespeare_chat,
    mixture_asset(["sotu", "shakespeare", CHAT_SOURCE]),
]

# kestrel (8 steps), then the planned cooldown jellyfish (4 steps) that spends the budget; the branch cools
# kestrel down for 4 steps of its own.
PLAN = PhasePlan(
    run="demo",
    first=phase_spec("kestrel", 8),
    phase_names=("kestrel", "jellyfish"),
    cooldown_tokens=4 * TOKENS_PER_STEP,
    min_cooldown_tokens=TOKENS_PER_STEP,
)
BRANCH = BranchSpec(name="early_cooldown", from_phase="kestrel", token_budget=4 * TOKENS_PER_STEP)
SFT = BranchSpec(
    name="sft",
    from_phase="kestrel",
    token_budget=3 * TOKENS_PER_STEP,
    schedule="constant",
    is_cooldown=False,
    mixture={CHAT_SOURCE: 1.0},
    peak_lr=1e-3,
)
WALL_CLOCK = {"tokens_per_s", "mfu"}  # metrics columns timed by the host's clock: they differ between any two runs


def _run(root: Path, plan: PhasePlan, monkeypatch) -> tuple[dg.DagsterInstance, ArtifactStoreResource, list[dg.RunRequest]]:
    """The run under ``plan`` in its own instance, store and telemetry, until the controller requests nothing."""
    root.mkdir()
    monkeypatch.setenv("MARIN_PREFIX", str(root))  # the trainer's live telemetry goes under it
    write_budget(root / "budget.yaml", Budget(budget_tokens=12 * TOKENS_PER_STEP))
    store = ArtifactStoreResource(prefix=str(root / "store"))
    resources = {
        "artifact_store": store,
        "artifact_io": ArtifactIOManager(artifact_store=store),
        "training_backend": LocalTrainingBackend(),
    }
    job = dg.define_asset_job("phase", selection=[train_phase], executor_def=dg.in_process_executor)
    defs = dg.Definitions(assets=[*DATA, train_phase], jobs=[job], resources=resources)
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize(DATA, instance=instance, resources=resources, run_config=MIXTURE_CONFIG).success
    sensor = phase_controller_sensor(plan, train_phase, budget_file=lambda: root / "budget.yaml")
    cursor, requests = None, []
    for _ in range(6):
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
        cursor = result.cursor or cursor
        if not result.run_requests:
            return instance, store, requests
        for add in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(add.partitions_def_name, list(add.partition_keys))
        for request in result.run_requests:
            config = request.run_config["ops"]["train__demo"]["config"]
            run = defs.resolve_job_def("phase").execute_in_process(
                run_config={"ops": {"train__demo": {"config": {**config, "base": BASE}}}},
                partition_key=request.partition_key,
                instance=instance,
                tags={**request.tags, "dagster/run_key": request.run_key},
            )
            assert run.success
            requests.append(request)
    raise AssertionError("the controller kept requesting phases")


def _files(data: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}


def _without_wall_clock(text: bytes) -> list[dict]:
    rows = [json.loads(line) for line in text.decode().splitlines()]
    assert rows and all(set(r) >= {"step", "loss", "lr", "grad_norm", "tokens", "phase"} for r in rows)
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


@pytest.mark.slow
def test_the_main_runs_versions_and_bytes_are_the_same_with_and_without_a_branch(tmp_path, monkeypatch):
    plain, plain_store, plain_requests = _run(tmp_path / "plain", PLAN, monkeypatch)
    branched, branched_store, branched_requests = _run(
        tmp_path / "branched", dataclasses.replace(PLAN, branches=(BRANCH, SFT)), monkeypatch
    )
    assert [(r.partition_key, r.tags["marin/action"]) for r in plain_requests] == [
        ("kestrel", "continue"),
        ("jellyfish", "cool_down"),
    ]
    assert [(r.partition_key, r.tags["marin/action"]) for r in branched_requests] == [
        ("kestrel", "continue"),
        ("jellyfish", "cool_down"),
        ("kestrel+early_cooldown", "branch"),
        ("kestrel+sft", "branch"),
    ]
    assert branched.get_dynamic_partitions(phases.name) == ["kestrel", "jellyfish", "kestrel+early_cooldown", "kestrel+sft"]

    for phase in ("kestrel", "jellyfish"):
        a, b = plain_store.store.read_pointer(TRAIN_KEY, phase), branched_store.store.read_pointer(TRAIN_KEY, phase)
        assert a.version == b.version, phase
        files_a, files_b = _files(Path(a.data_path)), _files(Path(b.data_path))
        assert sorted(files_a) == sorted(files_b) and any(name.startswith("checkpoints/") for name in files_a), phase
        # every file the same bytes (the checkpoints' arrays and meta among them), but for metrics.jsonl's timing
        assert {n: f for n, f in files_a.items() if n != "metrics.jsonl"} == {
            n: f for n, f in files_b.items() if n != "metrics.jsonl"
        }
        assert _without_wall_clock(files_a["metrics.jsonl"]) == _without_wall_clock(files_b["metrics.jsonl"]), phase
        assert a.counts == b.counts, phase

    # The branch: its own partition, warm-started from kestrel's checkpoint (its version chains to kestrel's),
    # cooled down linearly over 4 steps that continue kestrel's global step.
    kestrel = branched_store.store.read_pointer(TRAIN_KEY, "kestrel")
    branch = branched_store.store.read_pointer(TRAIN_KEY, BRANCH.partition)
    provenance = json.loads((Path(branch.data_path).parent / "provenance.json").read_text())
    assert provenance["config"]["warm_start_version"] == kestrel.version
    assert provenance["config"]["phase"]["warm_start_from"] == "kestrel"
    assert branch.counts["final_step"] == 12 and branch.counts["phase_start_step"] == 8 and branch.counts["is_cooldown"]
    rows = [r for r in read_metrics(Path(branch.data_path) / "metrics.jsonl") if r["phase"] == BRANCH.partition]
    assert [r["step"] for r in rows] == [9, 10, 11, 12]
    assert all(later["lr"] < earlier["lr"] for earlier, later in pairwise(rows))  # a linear decay
    arrays, meta = ckpt.load(resolve_checkpoint(branch.data_path))
    assert meta["step"] == 12 and meta["phase"] == BRANCH.partition

    # The SFT branch: warm-started from kestrel, 3 steps at a constant LR on the chat dataset alone, whose batches
    # carry the reply mask; its held-out loss is over the held-out play's replies.
    sft = branched_store.store.read_pointer(TRAIN_KEY, SFT.partition)
    provenance = json.loads((Path(sft.data_path).parent / "provenance.json").read_text())
    assert provenance["config"]["warm_start_version"] == kestrel.version
    assert provenance["config"]["phase"]["mixture"] == {CHAT_SOURCE: 1.0}
    rows = [r for r in read_metrics(Path(sft.data_path) / "metrics.jsonl") if r["phase"] == SFT.partition]
    assert [r["step"] for r in rows] == [9, 10, 11] and all(r["lr"] == pytest.approx(1e-3) for r in rows)
    chat = branched_store.store.read_pointer("datasets/shakespeare_chat", None)
    assert (
        chat.counts["plays"] == 4
        and chat.counts["validation_docs"] > 0
        and 0 < chat.counts["train_target_tokens"] < chat.counts["train_tokens"]
    )
    result = json.loads((Path(sft.data_path) / "train_result.json").read_text())
    assert result["validation_loss"] is not None and result["validation_loss"] > 0
