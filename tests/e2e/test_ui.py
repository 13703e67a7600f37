"""The operator path, for real: `dagster dev` (webserver + daemon), runs launched through
GraphQL and through `dagster job launch`, the routing launcher's local backend, the UI's
asset graph rendered by headless Chromium (no sign-up prompt over it; a training phase's
upstream lineage reaching the DataKit's shard assets and sources; an export's reaching its checkpoint asset
and the shards), and an experiment's report
asset (Markdown with embedded PNGs) rendered on its asset page.

Starting `dagster dev` is the slow part, so one server serves one test that walks the whole
path.
"""

import base64
import re
import struct
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e import _ui_util as ui

REPO = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).with_name("dagster"))
# A cheap subset of the datakit_sources job: fetch the pinned State-of-the-Union source, and the tokenizer.
JOB = "datakit_sources"
SUBSET_KEYS = (["sources", "sotu"], ["tokenizer"])
SUBSET_STEPS = ["sources__sotu", "tokenizer"]
# The code location of this test's `dagster dev` builds its experiment assets from this
# folder only (one tiny record), not from the repo's experiments/.
EXPERIMENTS = Path(__file__).parent / "experiments"
UI_RECORD = EXPERIMENTS / "ui_report.yaml"

LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
  ... on LaunchRunSuccess { run { runId } }
  ... on PythonError { message stack }
  ... on InvalidSubsetError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""


@pytest.fixture
def dagster_dev(tmp_path):
    root = tmp_path / "dagster_ui"
    server = ui.DagsterDev(
        REPO,
        home=root / "home",
        prefix=root / "prefix",
        log_path=root / "dagster_dev.log",
        dagster_bin=DAGSTER,
        extra_env={"MARIN_EXPERIMENTS_DIR": str(EXPERIMENTS)},
    )
    try:
        # Webserver, daemon and code server each import the definitions: slow on a loaded box.
        server.wait_ready(timeout_s=300)
        yield server
    finally:
        server.stop()


def launch_via_graphql(dagster_dev) -> dict:
    """Launch the demo subset through GraphQL (what the UI's Materialize button sends)."""
    params = {
        "selector": {
            "repositoryLocationName": ui.LOCATION,
            "repositoryName": ui.REPOSITORY,
            "jobName": JOB,
            "assetSelection": [{"path": k} for k in SUBSET_KEYS],
        },
        "runConfigData": {},
    }
    result = dagster_dev.gql(LAUNCH, {"p": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return dagster_dev.wait_for_run(result["run"]["runId"], timeout_s=480)


def assert_ran_on_local_backend(run: dict) -> None:
    messages = ui.run_messages(run)
    assert run["status"] == "SUCCESS", "\n".join(messages)
    assert run["jobName"] == JOB
    assert sorted(run["stepKeysToExecute"]) == sorted(SUBSET_STEPS)
    tags = ui.run_tags(run)
    # dagster.yaml's launcher classifies the untagged run as 1 x cpu and records the backend.
    assert tags["marin/backend"] == "local", tags
    assert tags["marin/accelerator"] == "cpu", tags
    assert any(re.fullmatch(r".*Routing \w+ run \(1 x cpu\) to backend local.*", m) for m in messages), messages
    assert any(m == f'Finished execution of run for "{JOB}".' for m in messages), messages


@pytest.mark.slow
def test_operator_path_dagster_dev_runs_and_asset_graph(dagster_dev, tmp_path, monkeypatch):
    graphql_run = launch_via_graphql(dagster_dev)
    assert_ran_on_local_backend(graphql_run)
    # The run really executed: the unpacked source is in the artifact store under MARIN_PREFIX.
    assert list(dagster_dev.prefix.glob("sources/sotu/__all__/*/data/raw-*.jsonl.gz"))

    check_dagster_job_launch(dagster_dev)

    binary = ui.find_chromium()
    if binary is None:
        pytest.skip(
            "dagster dev, the GraphQL run and the `dagster job launch` run passed; Chromium is "
            "not installed (Debian package `chromium`; .ci/run installs it), so the browser "
            "check of the asset graph was not run"
        )
    check_asset_graph_in_browser(dagster_dev, binary, tmp_path / "browser")
    markdown, speedup = materialize_experiment_report(dagster_dev, monkeypatch)
    check_experiment_report_in_browser(dagster_dev, binary, tmp_path / "report_browser", markdown, speedup)


def check_dagster_job_launch(dagster_dev) -> None:
    # `dagster job launch` submits to the QueuedRunCoordinator; the daemon of `dagster dev`
    # dequeues the run and hands it to the routing launcher.
    run_id = str(uuid.uuid4())
    cmd = [DAGSTER, "job", "launch", "-w", "workspace.yaml", "-j", JOB, "-o", ",".join(SUBSET_STEPS), "--run-id", run_id]
    proc = subprocess.run(cmd, cwd=REPO, env=dagster_dev.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = dagster_dev.wait_for_run(run_id, timeout_s=480)
    assert_ran_on_local_backend(run)
    # Same inputs as the GraphQL run: both steps are served from the content-addressed cache.
    messages = ui.run_messages(run)
    assert any(m.startswith("sources/sotu: cache hit") for m in messages), messages


def check_asset_graph_in_browser(dagster_dev, binary: str, tmp_path: Path) -> None:
    tmp_path.mkdir()

    group = dagster_dev.gql(
        """query($g: AssetGroupSelector!) { assetNodes(group: $g) { assetKey { path } } }""",
        {"g": {"groupName": "datakit", "repositoryName": ui.REPOSITORY, "repositoryLocationName": ui.LOCATION}},
    )["assetNodes"]
    # The graph labels a node with the last part of its key: sources/sotu and datasets/sotu
    # are both drawn as "sotu", so compare counts, not sets.
    expected = Counter(node["assetKey"]["path"][-1] for node in group)
    assert expected["sotu"] == 2 and expected["tokenized"] == expected["mixture"] == 1, expected

    graph_url = f"{dagster_dev.url}/locations/{ui.LOCATION}/asset-groups/datakit"
    # Layout runs in a web worker; on a loaded machine give it a second, longer chance.
    for budget_ms in (30_000, 90_000):
        dom = ui.chromium(binary, tmp_path / "profile", graph_url, mode=["--dump-dom"], budget_ms=budget_ms, timeout_s=240)
        missing = expected - Counter(ui.asset_node_names(dom))
        if not missing:
            break
    assert not missing, f"asset graph lacks {dict(missing)}; page text: {ui.visible_text(dom)[:2000]}"
    # A fresh instance shows no sign-up prompt over the graph (dagster.yaml: nux disabled).
    assert "Join the Dagster community" not in ui.visible_text(dom)
    check_phase_lineage_reaches_the_shards(dagster_dev, binary, tmp_path)
    check_export_lineage_reaches_a_checkpoint_and_the_shards(dagster_dev, binary, tmp_path)
    check_crawl_lineage_reaches_its_warc(dagster_dev, binary, tmp_path)

    shot = tmp_path / "asset_graph.png"
    ui.chromium(binary, tmp_path / "profile", graph_url, mode=[f"--screenshot={shot}"], budget_ms=30_000, timeout_s=240)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

    # The asset's own page shows its latest materialization from this instance: the metadata
    # carries the artifact path under this test's MARIN_PREFIX and the document count.
    page = f"{dagster_dev.url}/assets/sources/sotu"
    text = ui.visible_text(ui.chromium(binary, tmp_path / "profile", page, mode=["--dump-dom"], budget_ms=30_000, timeout_s=240))
    for needle in ("sources / sotu", "Latest materialization", str(dagster_dev.prefix / "sources" / "sotu"), "count/docs"):
        assert needle in text, f"{needle!r} not on {page}: {text[:3000]}"
    assert "Join the Dagster community" not in text


def check_phase_lineage_reaches_the_shards(dagster_dev, binary: str, tmp_path: Path) -> None:
    """The upstream lineage of a train/demo phase, as the asset page's Lineage tab draws it:
    mixture -> datasets -> shards/tokenized -> shards/final ... -> shards/index -> the sources, the
    crawl's WARC (sources/npm_docs) among them."""
    wanted = Counter(
        {"mixture": 1, "tokenized": 1, "final": 1, "pii": 1, "normalized": 1, "index": 1, "sotu": 2, "npm_docs": 2, "demo": 1}
    )
    upstream_lineage(dagster_dev, binary, tmp_path, "train/demo", wanted)


def check_crawl_lineage_reaches_its_warc(dagster_dev, binary: str, tmp_path: Path) -> None:
    """The web source's dataset, as the Lineage tab draws it: datasets/npm_docs -> shards/tokenized ...
    shards/language, shards/pii, shards/normalized -> shards/index -> sources/npm_docs (a WARC of pages).
    Both npm_docs nodes are labelled "npm_docs"."""
    wanted = Counter({"npm_docs": 2, "tokenized": 1, "language": 1, "pii": 1, "normalized": 1, "index": 1})
    upstream_lineage(dagster_dev, binary, tmp_path, "datasets/npm_docs", wanted)


def upstream_lineage(dagster_dev, binary: str, tmp_path: Path, key: str, wanted: Counter) -> str:
    """The DOM of ``key``'s upstream lineage page once it draws every node of ``wanted`` (node names, counted);
    layout runs in a web worker, so a loaded machine gets a second, longer chance."""
    page = f"{dagster_dev.url}/assets/{key}?view=lineage&lineageScope=upstream&lineageDepth=30"
    for budget_ms in (30_000, 90_000):
        dom = ui.chromium(binary, tmp_path / "profile", page, mode=["--dump-dom"], budget_ms=budget_ms, timeout_s=240)
        missing = wanted - Counter(ui.asset_node_names(dom))
        if not missing:
            return dom
    raise AssertionError(f"{key}'s upstream lineage lacks {dict(missing)}: {ui.asset_node_names(dom)}")


def check_export_lineage_reaches_a_checkpoint_and_the_shards(dagster_dev, binary: str, tmp_path: Path) -> None:
    """An export's upstream lineage: export/demo -> checkpoints/demo -> train/demo -> mixture -> ... -> shards/tokenized.
    The graph labels all three */demo nodes "demo"; the checkpoint is the one node of the group box "checkpoints"."""
    wanted = Counter({"demo": 3, "tokenizer": 1, "mixture": 1, "tokenized": 1, "index": 1})
    dom = upstream_lineage(dagster_dev, binary, tmp_path, "export/demo", wanted)
    groups = set(re.findall(r'data-tooltip="([^"]+)"', dom))  # the boxes the graph draws around each asset group
    assert {"checkpoints", "training", "datakit", "models"} <= groups, f"groups drawn: {sorted(groups)}"


def materialize_experiment_report(dagster_dev, monkeypatch) -> tuple[str, float]:
    """Materialise the tiny record's report asset into this `dagster dev`'s instance (in
    process, on its MARIN_PREFIX); return the report's Markdown and control_harm's speedup.

    The analysis it reports is the library's (``analyze``) over synthetic run losses from a
    known power law, baseline L(C) = 2 + 40 C^-0.2 plus +-0.002 seed noise, control_harm
    reaching at C the baseline's loss at C/2 (an effective speedup of 0.5): this test checks
    that the report renders; training runs are tests/experiments/test_screen_e2e.py's.
    """
    import dagster as dg

    from assets.experiments import _analysis_path, build_experiment_assets
    from marin_assets.experiments.analysis import analyze
    from marin_assets.experiments.record_files import load_record
    from marin_assets.orchestration import ArtifactStoreResource
    from marin_assets.store import ArtifactStore
    from marin_assets.store.fsutil import write_json_atomic

    record = load_record(UI_RECORD)

    def law(c: float) -> float:
        return 2.0 + 40.0 * c**-0.2

    rows = [
        {
            "arm": arm.name,
            "budget": b,
            "seed": s,
            "flops": b,
            "steps": 10,
            "seconds": 0.0,
            "validation_loss": law(b if arm.name == "baseline" else b / 2) + 0.002 * (s - 1),
        }
        for arm in record.all_arms()
        for b in record.budgets
        for s in arm.seeds
    ]
    result = analyze(record, rows)
    (harm,) = result["arms"]
    assert abs(harm["effective_speedup"] - 0.5) < 0.01 and result["controls_held"], harm
    store = ArtifactStore(str(dagster_dev.prefix))
    store.fs.makedirs(str(dagster_dev.prefix / "experiments" / "ui_report"), exist_ok=True)
    write_json_atomic(store.fs, _analysis_path(store, record), result)

    monkeypatch.setenv("DAGSTER_HOME", str(dagster_dev.home))  # dagster.yaml's sqlite base_dir
    runs, analysis, report = build_experiment_assets(UI_RECORD)
    with dg.DagsterInstance.from_config(str(dagster_dev.home)) as instance:
        done = dg.materialize(
            [runs, analysis, report],
            selection=[report.key],
            instance=instance,
            resources={"artifact_store": ArtifactStoreResource(prefix=str(dagster_dev.prefix))},
        )
    assert done.success
    return done.asset_materializations_for_node(report.node_def.name)[0].metadata["report"].value, harm["effective_speedup"]


def _png_widths(markdown: str) -> list[int]:
    """The pixel widths (PNG IHDR) of the images embedded in the Markdown as data: URIs."""
    blobs = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", markdown)
    return [struct.unpack(">I", base64.b64decode(b)[16:20])[0] for b in blobs]


# Clicks the report's "[Show Markdown]" (a long Markdown value opens in a dialog), then
# reports the dialog's text and its images once they have decoded.
_REPORT_DIALOG = """(() => {
  const dialog = document.querySelector('[role="dialog"]');
  if (!dialog) {
    const buttons = [...document.querySelectorAll('button, a, span')]
      .filter(e => e.textContent.trim() === '[Show Markdown]');
    if (buttons.length) buttons[buttons.length - 1].click();
    return null;
  }
  const images = [...dialog.querySelectorAll('img')];
  if (!images.length || images.some(i => !i.complete)) return null;
  return {text: dialog.innerText, headings: [...dialog.querySelectorAll('h1')].map(h => h.innerText),
          tables: dialog.querySelectorAll('table').length,
          images: images.map(i => ({alt: i.alt, src: i.getAttribute('src').slice(0, 22), width: i.naturalWidth}))};
})()"""


def check_experiment_report_in_browser(dagster_dev, binary: str, tmp_path: Path, markdown: str, speedup: float) -> None:
    page = f"{dagster_dev.url}/assets/experiments/ui_report/report"
    seen = ui.chromium_poll(binary, tmp_path / "profile", page, _REPORT_DIALOG, timeout_s=180)
    # The Markdown is rendered (a heading and a table, no raw "**"), not shown as text.
    assert seen["headings"] == ["Experiment ui_report"], seen["headings"]
    assert seen["tables"] == 1 and "**" not in seen["text"], seen["text"][:2000]
    for needle in ("Criterion held: yes", "Controls held: yes", "control_harm: ci high below 1: held", "effective speedup"):
        assert needle in seen["text"], f"{needle!r} not in the report dialog: {seen['text'][:2000]}"
    assert re.search(rf"control_harm\s+{speedup:.3f}\s+\[", seen["text"]), seen["text"][:2000]  # the table row
    # Both plots decoded in the browser, at the widths of the PNGs the asset embedded.
    assert [(i["alt"], i["src"]) for i in seen["images"]] == [
        ("loss vs compute", "data:image/png;base64,"),
        ("speedups", "data:image/png;base64,"),
    ], seen["images"]
    assert [i["width"] for i in seen["images"]] == _png_widths(markdown) and min(_png_widths(markdown)) > 300
