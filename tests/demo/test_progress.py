"""What `make demo` prints: one line per asset as it lands (computed or cache hit, seconds,
counts) with a bar over the run, failures with the user code's error, and Dagster's event
stream sent to a log file instead of the terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import dagster as dg

from demo.progress import Progress, key_counts, run_directly, stderr_to, watched
from marin_assets.orchestration import (
    ArtifactIOManager,
    ArtifactStoreResource,
    StageConfig,
    StageContext,
    versioned,
    versioned_asset,
)


class Rows(StageConfig):
    rows: int = versioned(3)


@versioned_asset(key="p/first", code_version="1", config_cls=Rows)
def first(ctx: StageContext, config: Rows):
    return {"rows": config.rows, "note": "text counts are not shown", "ok": True}


@versioned_asset(key="p/second", code_version="1", ins={"up": "p/first"})
def second(ctx: StageContext, up):
    if up.counts["rows"] < 0:
        raise ValueError("negative rows from p/first")
    return {"rows": up.counts["rows"] * 2, "loss": 2.5}


def _materialize(instance, resources, tags, rows=3):
    return dg.materialize(
        [first, second],
        instance=instance,
        resources=resources,
        tags=tags,
        raise_on_error=False,
        run_config={"ops": {"p__first": {"config": {"rows": rows}}}},
    )


def test_one_line_per_asset_with_a_bar_then_cache_hits_then_a_failure(tmp_path):
    store = ArtifactStoreResource(prefix=str(tmp_path))
    resources = {"artifact_store": store, "artifact_io": ArtifactIOManager(artifact_store=store)}
    with dg.instance_for_test() as instance:
        out = io.StringIO()
        result = watched(instance, Progress(2, out), {"t": "1"}, lambda: _materialize(instance, resources, {"t": "1"}))
        assert result.success
        lines = out.getvalue().splitlines()
        assert len(lines) == 2
        assert lines[0].startswith("[##########..........]   1/2  p/first") and "computed" in lines[0]
        assert lines[1].startswith("[####################]   2/2  p/second") and "rows=6" in lines[1] and "loss=2.5" in lines[1]
        assert "note" not in lines[0] and "ok=" not in lines[0]  # scalar numbers only

        again = io.StringIO()
        watched(instance, Progress(2, again), {"t": "2"}, lambda: _materialize(instance, resources, {"t": "2"}))
        assert [("cache hit" in line) for line in again.getvalue().splitlines()] == [True, True]

        failed = io.StringIO()
        result = watched(
            instance, Progress(2, failed), {"t": "3"}, lambda: _materialize(instance, resources, {"t": "3"}, rows=-1)
        )
        assert not result.success
        lines = failed.getvalue().splitlines()
        assert "p/first" in lines[0] and "computed" in lines[0]
        assert "p__second" in lines[1] and "FAILED" in lines[1] and "ValueError: negative rows from p/first" in lines[1]


def test_without_a_total_the_bar_is_a_count():
    out = io.StringIO()
    progress = Progress(None, out)
    progress.asset("train/demo[kestrel]", {"cache_hit": False, "duration_s": 12.0, "count/tokens_trained": 24576})
    assert out.getvalue().split() == ["1", "train/demo[kestrel]", "computed", "12.0s", "tokens_trained=24,576"]
    assert key_counts({"count/a": 1, "count/b": 0.5, "count/c": "x", "count/d": [1], "path": 3}) == "a=1 b=0.5"
    assert run_directly(lambda tags: tags["k"], {"k": "v"}) == "v"


def test_stderr_of_this_process_and_its_children_goes_to_the_log(tmp_path, capfd):
    log = tmp_path / "logs" / "demo.log"
    with stderr_to(log) as terminal:
        os.write(2, b"DEBUG from this process\n")  # file descriptor 2: what sys.stderr is outside pytest
        subprocess.run([sys.executable, "-c", "import sys; print('DEBUG from a step subprocess', file=sys.stderr)"], check=True)
        print("for the person", file=terminal)
    os.write(2, b"stderr is back\n")
    text = log.read_text()
    assert "DEBUG from this process" in text and "DEBUG from a step subprocess" in text
    captured = capfd.readouterr().err
    assert "for the person" in captured and "stderr is back" in captured and "DEBUG" not in captured
