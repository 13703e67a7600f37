"""Every job of jobs/ run as a user's CI runs it: Dagster's own CLI in subprocesses (argv lists, no
shell) against a fresh DAGSTER_HOME (the repo's dagster.yaml) and MARIN_PREFIX, each one twice: the
second pass is all cache hits. The commands are the README's ("In your own CI").

- The DataKit over the demo sources: the `datakit_sources` job, then one `dagster asset materialize`
  per later wave (a run covers one partitions definition; the shard, bucket and band waves are
  `--partition-range` runs, which the assets' single-run backfill policy allows).
- One train phase (`train_phase`, a few steps through run config) and its eval (`evaluate`).
- The scaling ladder (`scaling`): its predictions first, then the phase, then the whole job in one
  run over the sweep's partition range (the `main` target scores the phase).
- The `experiments` job over a CI-sized record ($MARIN_EXPERIMENTS_DIR): one run per runs partition
  (that asset computes one partition per run, so a range run is refused).

Steps other than `datakit_sources` (whose executor is its own) run in process (`execution: in_process`
in the run config): the multiprocess default spawns a process per step, which re-imports the code
location (~5 s each) for what is mostly cache hits. The module prints how long each step took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
DEFS = ["-f", "definitions.py"]

# The run configs a CI keeps in its repository, as the README shows them (examples/ci/): every step but
# `datakit_sources` runs in the CLI's process; the phase is the plan's first, shortened to 8 steps.
CI_CONFIGS = REPO / "examples" / "ci"
IN_PROCESS = yaml.safe_load((CI_CONFIGS / "in_process.yaml").read_text())

# The DataKit after `datakit_sources`, one command per wave (demo/datakit.py runs the same waves in
# process): None for an unpartitioned wave, else the partitions its range covers. The last test
# holds this list to the graph's own waves (marin_assets/orchestration/waves.py).
SHARDS, BUCKETS, BANDS = "shards", "bucket-000...bucket-015", "band-00...band-25"
WAVES = [
    (["shards/normalized", "shards/pii", "shards/quality", "shards/exact_map", "shards/language"], SHARDS),
    (["shards/exact_reduce"], BUCKETS),
    (["shards/exact_removals", "shards/filtered_exact", "shards/fuzzy_map", "shards/decontam"], SHARDS),
    (["shards/fuzzy_candidates"], BANDS),
    (["shards/fuzzy_edges"], SHARDS),
    (["shards/fuzzy_removals"], None),
    (["shards/final", "shards/tokenized"], SHARDS),
    (
        [
            "datasets/npm_docs",
            "datasets/shakespeare",
            "datasets/shakespeare_chat",
            "datasets/sotu",
            "datasets/spam_assassin",
            "datasets/user",
            "mixture",
        ],
        None,
    ),
]
# The shard keys come from the index's run (a dynamic set): a CI reads the first and last from the instance.
SHARD_RANGE = (
    "import dagster as dg; k = dg.DagsterInstance.get().get_dynamic_partitions('datakit_shards'); print(f'{k[0]}...{k[-1]}')"
)

# What the pinned demo sources (sha256-verified artifacts) become: per dataset its shards, documents
# and tokens after the filters and dedup (train, validation); `user` is empty ($MARIN_USER_DATA_DIR unset).
EXPECTED_DATASETS = {
    "npm_docs": {"shards": 1, "train_docs": 77, "validation_docs": 3, "train_tokens": 316_192, "validation_tokens": 2_336},
    "shakespeare": {
        "shards": 10,
        "train_docs": 67,
        "validation_docs": 10,
        "train_tokens": 8_193_010,
        "validation_tokens": 1_350_126,
    },
    "sotu": {"shards": 11, "train_docs": 220, "validation_docs": 13, "train_tokens": 9_987_552, "validation_tokens": 773_883},
    "spam_assassin": {
        "shards": 26,
        "train_docs": 5_148,
        "validation_docs": 109,
        "train_tokens": 17_612_340,
        "validation_tokens": 362_910,
    },
    "user": {"shards": 0, "train_docs": 0, "validation_docs": 0, "train_tokens": 0, "validation_tokens": 0},
}
EXPECTED_CHAT = {
    "plays": 77,
    "train_docs": 12_406,
    "validation_docs": 2_040,
    "train_tokens": 7_603_184,
    "validation_tokens": 1_284_738,
}

# One phase of train/demo: the plan's first (kestrel) at 8 steps of 8 x 64 tokens instead of 48.
PHASE = "kestrel"
ADD_PHASE = f"import dagster as dg; dg.DagsterInstance.get().add_dynamic_partitions('demo_phases', ['{PHASE}'])"
PHASE_CONFIG = yaml.safe_load((CI_CONFIGS / "phase.yaml").read_text())
# The eval with a task of the suite as well (a changed eval: a new version of eval/demo[kestrel]).
TASK_EVAL_CONFIG = {**IN_PROCESS, "ops": {"eval__demo": {"config": {"tasks": ["arc_easy"], "limit": 8}}}}
PARTITION = {"dagster/partition": PHASE}

# The demo's MoE ladder as shipped (2 budgets x 3 widths, C_fit 4e9: ~1 CPU-minute here): one run
# covers its sweep's partition range and the unpartitioned steps around it.
SWEEP_RANGE = {"dagster/asset_partition_range_start": "C2e09-d4", "dagster/asset_partition_range_end": "C4e09-d32"}
PREDICTIONS = "*scaling__moe__x3__prediction,*scaling__moe__main__prediction"  # with their ancestors

# A CI-sized experiment record (the repo's screen is 63 runs, ~15 minutes): 2 arms x 3 budgets x 2
# seeds of 10-40 steps of a 16-wide MoE on the first 6 standard-library files.
RECORD = {
    "name": "ci_screen",
    "hypothesis": "A 30x lower learning rate needs more compute to reach the baseline's loss.",
    "links": {"issue": 38},
    "baseline": {
        "config": {
            "model": {
                "d_model": 16,
                "n_layers": 1,
                "n_heads": 2,
                "n_kv_heads": 1,
                "d_ff": 32,
                "n_routed_experts": 2,
                "n_shared_experts": 1,
                "top_k": 1,
                "expert_d_ff": 16,
                "max_seq_len": 16,
            },
            "seq_len": 16,
            "batch_size": 4,
            "schedule": {"kind": "constant", "warmup_steps": 2, "peak_lr": 0.003},
        }
    },
    "budgets": [3.0e7, 6.0e7, 1.2e8],
    "seeds": [0, 1],
    "validation_windows": 32,
    "bootstrap": 50,
    "data_files": 6,
    "arms": {"control_harm": {"change": {"schedule": {"peak_lr": 0.0001}}, "expect": {"ci_high_below": 1.0}}},
    "criterion": {
        "statement": "control_harm is worse than the baseline",
        "checks": [{"arm": "control_harm", "speedup_below": 1.0}],
    },
}


class CI:
    """A fresh Dagster instance and artifact prefix, the CLI run against them, and each step's time."""

    def __init__(self, root: Path):
        self.root, self.home, self.prefix = root, root / "dagster_home", root / "artifacts"
        self.home.mkdir()
        (self.home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("MARIN_SHARDS_PER_RUN", "MARIN_USER_DATA_DIR", "MARIN_TRAINING_BACKEND", "MARIN_EXPERIMENTS_DIR")
        }
        self.env = {**env, "DAGSTER_HOME": str(self.home), "MARIN_PREFIX": str(self.prefix)}
        self.env.setdefault("JAX_PLATFORMS", "cpu")  # what `make` sets
        self.env.setdefault("WANDB_MODE", "offline")
        self.timings: list[tuple[str, float]] = []

    def config(self, name: str, config: dict) -> str:
        """A run config file, as a CI keeps them in its repository."""
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return str(path)

    def run(self, step: str, argv: list[str], extra_env: dict[str, str] | None = None) -> str:
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, env={**self.env, **(extra_env or {})}, capture_output=True, text=True, timeout=900)
        self.timings.append((step, time.monotonic() - started))
        assert proc.returncode == 0, f"{step}: {argv[1:]} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
        return proc.stdout

    def dagster(self, step: str, *args: str, extra_env: dict[str, str] | None = None) -> str:
        return self.run(step, [DAGSTER, *args], extra_env)

    def python(self, step: str, code: str) -> str:
        return self.run(step, [sys.executable, "-c", code])

    @contextmanager
    def instance(self) -> Iterator[dg.DagsterInstance]:
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            yield instance

    def run_ids(self) -> set[str]:
        with self.instance() as instance:
            return {r.dagster_run.run_id for r in instance.get_run_records()}

    @contextmanager
    def new_runs(self) -> Iterator[list[str]]:
        """The runs the block starts (filled in when it ends)."""
        before, runs = self.run_ids(), []
        yield runs
        runs.extend(sorted(self.run_ids() - before))

    def events(self, run_ids: list[str]) -> tuple[list[dg.AssetMaterialization], list[dg.AssetCheckEvaluation]]:
        """Every materialisation and check evaluation of these runs."""
        materialisations, checks = [], []
        with self.instance() as instance:
            for run_id in run_ids:
                for entry in instance.all_logs(
                    run_id, of_type={dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_CHECK_EVALUATION}
                ):
                    event = entry.get_dagster_event()
                    if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
                        materialisations.append(entry.asset_materialization)
                    else:
                        checks.append(event.event_specific_data)
        return materialisations, checks


def _done(materialisations: list[dg.AssetMaterialization]) -> dict[tuple[str, str | None], dict]:
    """{(asset, partition): metadata values} of what the runs materialised (not the checkpoints train/demo
    reports as it trains: those are no step of the run)."""
    return {
        (m.asset_key.to_user_string(), m.partition): {k: v.value for k, v in m.metadata.items()}
        for m in materialisations
        if m.asset_key.path[0] != "checkpoints"
    }


def _hits(done: dict[tuple[str, str | None], dict]) -> set[bool]:
    return {meta["cache_hit"] for meta in done.values()}


@pytest.fixture(scope="module")
def ci(tmp_path_factory) -> Iterator[CI]:
    ci = CI(tmp_path_factory.mktemp("ci"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(ci.home))  # the instance this process reads: dagster.yaml names it
        started = time.monotonic()
        yield ci
    total = time.monotonic() - started
    lines = [f"  {seconds:6.1f}s  {step}" for step, seconds in ci.timings]
    groups: dict[str, float] = {}
    for step, seconds in ci.timings:
        groups[step.split(":")[0]] = groups.get(step.split(":")[0], 0.0) + seconds
    lines += [f"  {seconds:6.1f}s  = {group}" for group, seconds in groups.items()]
    print(
        f"\ntest_ci_jobs: {len(ci.timings)} CLI runs, {sum(s for _, s in ci.timings):.0f}s in the CLI, "
        f"{total:.0f}s in all\n" + "\n".join(lines)
    )


def _datakit_pass(ci: CI, label: str) -> list[str]:
    with ci.new_runs() as runs:
        ci.dagster(f"{label}: datakit_sources", "job", "execute", *DEFS, "-j", "datakit_sources")
        shards = ci.python(f"{label}: shard range", SHARD_RANGE).strip()
        config = ci.config("in_process", IN_PROCESS)
        for keys, partitions in WAVES:
            span = shards if partitions == SHARDS else partitions
            ci.dagster(
                f"{label}: {keys[0]}{' ...' if len(keys) > 1 else ''}",
                "asset",
                "materialize",
                *DEFS,
                "--select",
                ",".join(keys),
                *(["--partition-range", span] if span else []),
                "-c",
                config,
            )
    return runs


@pytest.fixture(scope="module")
def datakit(ci):
    return _datakit_pass(ci, "datakit 1"), _datakit_pass(ci, "datakit 2")


@pytest.fixture(scope="module")
def predictions(ci, datakit):
    """The ladder's runs, fit and frozen predictions: before the main run trains."""
    with ci.new_runs() as runs:
        ci.dagster(
            "scaling: predictions",
            "job",
            "execute",
            *DEFS,
            "-j",
            "scaling",
            "-o",
            PREDICTIONS,
            "--tags",
            json.dumps(SWEEP_RANGE),
            "-c",
            ci.config("in_process", IN_PROCESS),
        )
    return runs


@pytest.fixture(scope="module")
def phase(ci, datakit, predictions):
    ci.python("train: add the phase partition", ADD_PHASE)
    phase_config, in_process = ci.config("phase", PHASE_CONFIG), ci.config("in_process", IN_PROCESS)
    task_config = ci.config("task_eval", TASK_EVAL_CONFIG)
    # (the pass's key, the step's name, the job, its run config): each a `dagster job execute` of the phase's partition
    steps = [
        ("train", "train_phase", "train_phase", phase_config),
        ("evaluate", "evaluate", "evaluate", in_process),
        ("task_eval", "evaluate with a task", "evaluate", task_config),
    ]
    passes = []
    for n in (1, 2):
        runs = {}
        for key, name, job, config in steps:
            with ci.new_runs() as runs[key]:
                ci.dagster(
                    f"train {n}: {name}", "job", "execute", *DEFS, "-j", job, "--tags", json.dumps(PARTITION), "-c", config
                )
        passes.append(runs)
    return passes


@pytest.fixture(scope="module")
def ladder(ci, predictions, phase):
    """The whole scaling job, twice: the targets (the main one scores the phase) and the comparison, then cache hits."""
    passes = []
    for n in (1, 2):
        with ci.new_runs() as runs:
            ci.dagster(
                f"scaling {n}: the whole job",
                "job",
                "execute",
                *DEFS,
                "-j",
                "scaling",
                "--tags",
                json.dumps(SWEEP_RANGE),
                "-c",
                ci.config("in_process", IN_PROCESS),
            )
        passes.append(runs)
    return passes


def test_the_whole_datakit_over_the_demo_sources_then_all_cache_hits(ci, datakit):
    first, second = (ci.events(runs) for runs in datakit)
    done, again = _done(first[0]), _done(second[0])
    assert len(datakit[0]) == len(datakit[1]) == 1 + len(WAVES)  # a run per command, none failed
    with ci.instance() as instance:
        shards = instance.get_dynamic_partitions("datakit_shards")
    assert len(shards) == sum(d["shards"] for d in EXPECTED_DATASETS.values()) == 48
    # Every asset of the group, every partition of each: 5 sources + 3 fixed inputs + the index, the
    # per-shard steps (48 each), the 16 bucket and 26 band reduces, the datasets and the mixture.
    per_asset = {}
    for asset, _ in done:
        per_asset[asset] = per_asset.get(asset, 0) + 1
    assert {a: n for a, n in per_asset.items() if n > 1} == {
        **{
            f"shards/{s}": 48
            for s in (
                "normalized",
                "pii",
                "quality",
                "exact_map",
                "language",
                "exact_removals",
                "filtered_exact",
                "fuzzy_map",
                "decontam",
                "fuzzy_edges",
                "final",
                "tokenized",
            )
        },
        "shards/exact_reduce": 16,
        "shards/fuzzy_candidates": 26,
    }
    assert sum(per_asset.values()) == 12 * 48 + 16 + 26 + 9 + 1 + 7
    assert _hits(done) == {False}  # a fresh prefix: everything computed
    assert set(again) == set(done) and _hits(again) == {True}  # the second pass: every one a cache hit

    counts = {
        name: {k: meta[f"count/{k}"] for k in EXPECTED_DATASETS["user"]}
        for (asset, _), meta in done.items()
        if asset.startswith("datasets/") and asset != "datasets/shakespeare_chat"
        for name in [asset.split("/", 1)[1]]
    }
    assert counts == EXPECTED_DATASETS
    chat = done[("datasets/shakespeare_chat", None)]
    assert {k: chat[f"count/{k}"] for k in EXPECTED_CHAT} == EXPECTED_CHAT
    mixture = done[("mixture", None)]
    datasets = {a.split("/", 1)[1]: meta for (a, _), meta in done.items() if a.startswith("datasets/")}
    assert mixture["count/datasets"] == {
        name: {"train_tokens": meta["count/train_tokens"], "version": meta["version"]} for name, meta in datasets.items()
    }
    assert mixture["count/sources"] == 3 and mixture["count/vocab_size"] == 257
    # The datasets' blocking contamination checks ran in both passes and held.
    for _, checks in (first, second):
        assert sorted(c.asset_key.to_user_string() for c in checks) == sorted(f"datasets/{d}" for d in datasets)
        assert all(c.passed for c in checks)


def test_one_train_phase_and_its_eval_then_cache_hits(ci, phase):
    first, second = ({step: _done(ci.events(runs)[0]) for step, runs in p.items()} for p in phase)
    train = first["train"][("train/demo", PHASE)]
    assert (train["cache_hit"], train["count/final_step"], train["count/tokens_trained"]) == (False, 8, 8 * 512)
    assert train["count/final_checkpoint"] == f"{PHASE}.000000008"
    scored = first["train"][("eval/demo", PHASE)]  # the train_phase job evaluates the phase it trained
    assert scored["cache_hit"] is False and set(EXPECTED_DATASETS) - {"user"} <= {
        k.split("/", 2)[2] for k in scored if k.startswith("count/bpb/")
    }
    # The evaluate job re-runs that eval: unchanged, a cache hit of the same version; with a task, a new version.
    [(key, rescored)] = first["evaluate"].items()
    assert key == ("eval/demo", PHASE) and rescored["cache_hit"] is True and rescored["version"] == scored["version"]
    task = first["task_eval"][("eval/demo", PHASE)]
    assert task["cache_hit"] is False and task["version"] != scored["version"] and 0 <= task["count/acc/arc_easy"] <= 1
    # Second pass: each run a cache hit of the version the first pass made.
    for step, done in second.items():
        assert set(done) == set(first[step]) and _hits(done) == {True}, step
        assert all(done[k]["version"] == first[step][k]["version"] for k in done), step
    with ci.instance() as instance:
        assert instance.get_dynamic_partitions("demo_checkpoints") == [f"{PHASE}.000000004", f"{PHASE}.000000008"]


def test_the_scaling_ladder_predicts_before_the_phase_then_scores_it_then_cache_hits(ci, predictions, ladder):
    predicted = _done(ci.events(predictions)[0])
    sweep = [f"C{b}-d{w}" for b in ("2e09", "4e09") for w in (4, 12, 32)]
    assert set(predicted) == {
        ("scaling/moe/lr_sweep", None),
        *(("scaling/moe/sweep", k) for k in sweep),
        ("scaling/moe/fit", None),
        ("scaling/moe/x3/prediction", None),
        ("scaling/moe/main/prediction", None),
    }
    assert _hits(predicted) == {False}
    (first, checks), (second, checks_again) = (ci.events(runs) for runs in ladder)
    done, again = _done(first), _done(second)
    targets = {("scaling/moe/x3/target", None), ("scaling/moe/main/target", None), ("scaling/moe/comparison", None)}
    assert set(done) == set(predicted) | targets
    assert {k: meta["cache_hit"] for k, meta in done.items()} == {**{k: True for k in predicted}, **{k: False for k in targets}}
    assert set(again) == set(done) and _hits(again) == {True}
    assert done[("scaling/moe/main/target", None)]["count/phase"] == PHASE  # the phase trained above, scored
    # The comparison's check: the x3 run within the ladder's bound. The main target's prediction is the demo's
    # 85-step run, not this 8-step phase, so its row misses the bound and the (non-blocking) check fails.
    [check] = checks
    rows = {row["target"]: row for row in check.metadata["rows"].value}
    assert abs(rows["x3"]["relative_error"]) <= check.metadata["bound"].value
    assert check.passed is all(abs(r["relative_error"]) <= check.metadata["bound"].value for r in rows.values())
    assert len(checks_again) == 1


def test_the_experiments_job_over_a_ci_sized_record_then_cache_hits(ci):
    from marin_assets.experiments.record_files import record_outline
    from marin_assets.experiments.runs import partition_key

    records = ci.root / "records"
    records.mkdir()
    path = records / f"{RECORD['name']}.yaml"
    path.write_text(yaml.safe_dump(RECORD, sort_keys=False))
    keys = [partition_key(*run) for run in record_outline(path).runs]
    env, config, op = {"MARIN_EXPERIMENTS_DIR": str(records)}, ci.config("in_process", IN_PROCESS), "experiments__ci_screen"
    passes = []
    for n in (1, 2):
        with ci.new_runs() as runs:
            ci.dagster(
                f"experiments {n}: corpus",
                "job",
                "execute",
                *DEFS,
                "-j",
                "experiments",
                "-o",
                "experiments__corpus",
                "-c",
                config,
                extra_env=env,
            )
            for key in keys:
                ci.dagster(
                    f"experiments {n}: runs[{key}]",
                    "job",
                    "execute",
                    *DEFS,
                    "-j",
                    "experiments",
                    "-o",
                    f"{op}__runs",
                    "--tags",
                    json.dumps({"dagster/partition": key}),
                    "-c",
                    config,
                    extra_env=env,
                )
            ci.dagster(
                f"experiments {n}: analysis, report",
                "job",
                "execute",
                *DEFS,
                "-j",
                "experiments",
                "-o",
                f"{op}__analysis,{op}__report",
                "-c",
                config,
                extra_env=env,
            )
        passes.append(_done(ci.events(runs)[0]))
    first, second = passes
    runs_done = {p: meta for (a, p), meta in first.items() if a == "experiments/ci_screen/runs"}
    assert sorted(runs_done) == sorted(keys) and len(keys) == 12
    assert {meta["cache_hit"] for meta in runs_done.values()} == {False}
    assert {meta["steps"] for meta in runs_done.values()} == {10, 20, 40}
    report = first[("experiments/ci_screen/report", None)]
    assert report["criterion_held"] is True and report["controls_held"] is True
    # The corpus asset ran the DataKit over the files (recorded in this instance, under its own store).
    assert False in {meta["cache_hit"] for (a, _), meta in first.items() if not a.startswith("experiments/")}
    # Second pass: every run and every DataKit step the corpus asset starts is a cache hit (its up-to-date
    # waves start no run at all). The corpus, analysis and report are plain assets (no content version):
    # they run again, cheaply, and say nothing of a cache.
    plain = {("experiments/corpus", None), ("experiments/ci_screen/analysis", None), ("experiments/ci_screen/report", None)}
    assert {k for k in first if k[0].startswith("experiments/")} <= set(second) <= set(first)
    assert {k for k, meta in second.items() if "cache_hit" not in meta} == plain
    assert {meta["cache_hit"] for k, meta in second.items() if k not in plain} == {True}
    assert second[("experiments/corpus", None)]["datasets"] == first[("experiments/corpus", None)]["datasets"]


def test_the_ci_waves_are_the_datakit_graphs_waves():
    """The commands above (and the README's) cover the DataKit group, wave by wave."""
    from definitions import defs
    from demo.datakit import datakit_keys
    from jobs import datakit_sources_job
    from marin_assets.orchestration.waves import plan_waves

    assets = [a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)]
    planned = [sorted(k.to_user_string() for k in w.keys) for w in plan_waves(assets, datakit_keys(defs))]
    sources = datakit_sources_job.selection.resolve(defs.resolve_asset_graph())
    assert planned[0] == sorted(k.to_user_string() for k in sources)
    assert planned[1:] == [sorted(keys) for keys, _ in WAVES]
