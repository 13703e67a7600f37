"""metrics.jsonl on a local disk and on an object store (fsspec memory://): the same rows,
the same truncation on resume, the same torn-line rule."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marin_assets.train.metrics import MetricsLogger, plot_loss_curve, read_metrics


@pytest.fixture(params=["local", "memory"])
def out_dir(request, tmp_path):
    if request.param == "local":
        yield tmp_path / "out"
        return
    root = f"/metrics-{uuid.uuid4().hex[:8]}"
    yield f"memory://{root}/out"
    fsspec.filesystem("memory").rm(root, recursive=True)


def rows(n: int, start: int = 1) -> list[dict]:
    return [{"step": s, "loss": 5.0 - s / 10, "skipped": False, "phase": "main"} for s in range(start, start + n)]


def test_rows_written_flushed_truncated_and_read_back(out_dir):
    logger = MetricsLogger(out_dir)
    assert logger.path == (Path(out_dir) / "metrics.jsonl" if isinstance(out_dir, Path) else f"{out_dir}/metrics.jsonl")
    assert read_metrics(logger.path) == [] and not logger.exists()
    logger.truncate_after(-1)  # a fresh start with no file: nothing to truncate, nothing created
    assert not logger.exists()
    for row in rows(6):
        logger.write(row)
    logger.flush()  # the loop flushes before each checkpoint: the file covers every row so far
    assert [r["step"] for r in read_metrics(logger.path)] == [1, 2, 3, 4, 5, 6]
    logger.write({"step": 7, "loss": float("nan"), "skipped": True, "phase": "main"})
    logger.close()
    back = read_metrics(logger.path)
    assert back[:6] == rows(6) and back[6]["loss"] == "nan"  # JSON has no NaN: kept readable
    # a resume from the step-4 checkpoint drops 5-7, and the next rows follow 4
    again = MetricsLogger(out_dir)
    again.truncate_after(4)
    for row in rows(2, start=5):
        again.write(row)
    again.close()
    assert read_metrics(again.path) == rows(6)


def test_a_torn_last_line_ends_the_rows(out_dir):
    logger = MetricsLogger(out_dir)
    fs, path = logger.fs, str(logger.path).removeprefix("memory://")
    with fs.open(path, "wb") as f:
        f.write(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(logger.path)] == [1, 2]


def test_the_loss_curve_is_a_png_wherever_the_out_dir_is(out_dir):
    MetricsLogger(out_dir)  # makes the dir
    png = plot_loss_curve(rows(5), f"{out_dir}/loss_curve.png", title="t")
    with fsspec.open(str(png), "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.fixed_dictionaries({"step": st.integers(0, 10**6), "loss": st.floats(allow_nan=False)}), max_size=8), st.data()
)
def test_read_metrics_returns_a_prefix_of_the_rows_whatever_the_cut(written, data):
    """A writer killed mid-line leaves any byte prefix of the file: the reader returns the rows
    before the cut (the one it cut dropped), never an error or a garbled row."""
    text = "".join(json.dumps(r) + "\n" for r in written).encode()
    cut = data.draw(st.integers(0, len(text)))
    url = f"memory:///metrics-prop-{uuid.uuid4().hex[:8]}/metrics.jsonl"
    with fsspec.open(url, "wb") as f:
        f.write(text[:cut])
    try:
        got = read_metrics(url)
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"))
    complete = text[:cut].count(b"\n")
    assert got[:complete] == written[:complete] and len(got) in (complete, complete + 1)
    if len(got) > complete:  # a cut right after a row's closing brace still parses: that row
        assert got[-1] == written[complete]


MOE_COLUMNS = (
    "moe/drop_rate",
    "moe/drop_rate_sender",
    "moe/drop_rate_receiver",
    "moe/load_max_over_mean",
    "moe/load_cv",
    "moe/router_z_loss",
)


def test_throughput_is_tokens_over_the_time_of_a_trailing_window_of_rows():
    from marin_assets.model.flops import PeakFlops
    from marin_assets.train.emit import Throughput

    times = iter([10.0, 10.5, 11.5, 11.75, 20.0, 21.0])
    clock = Throughput(PeakFlops(1e9, "configured"), clock=lambda: next(times), window=2)
    assert clock.columns(1, 1000, 300.0) == {}  # the first row: its interval would hold the compile
    assert clock.columns(2, 2000, 300.0) == {"tokens_per_s": 2000.0, "mfu": 2000.0 * 300.0 / 1e9}
    assert clock.columns(3, 3000, 300.0) == {"tokens_per_s": 2000 / 1.5, "mfu": 2000 / 1.5 * 300.0 / 1e9}
    assert clock.columns(4, 4000, 300.0)["tokens_per_s"] == 2000 / 1.25  # the window: rows 2..4
    assert clock.columns(7, 7000, 300.0) == {}  # not the next step (a resume): no interval to time
    assert clock.columns(8, 8000, 300.0)["tokens_per_s"] == 1000.0


def test_moe_columns_flatten_per_step_and_per_layer_and_reach_telemetry_fields():
    from marin_assets.train.emit import moe_columns
    from marin_assets.train.metrics import telemetry_fields

    moe = {
        "drop_rate": 0.25,
        "drop_rate_sender": 0.125,
        "drop_rate_receiver": 0.125,
        "load_max_over_mean": 2.0,
        "load_cv": 1.0,
        "router_z_loss": 1.5,
        "layer_drop_rate": [0.5, 0.0],
        "layer_load_max_over_mean": [3.0, 1.0],
        "layer_load_cv": [1.5, 0.5],
        "layer_router_z_loss": [2.0, 1.0],
    }
    cols = moe_columns(moe)
    assert {k: cols[k] for k in MOE_COLUMNS} == {f"moe/{k}": moe[k] for k in (c.removeprefix("moe/") for c in MOE_COLUMNS)}
    assert cols["moe/layer0/drop_rate"] == 0.5 and cols["moe/layer1/load_cv"] == 0.5
    assert cols["moe/layer0/load_max_over_mean"] == 3.0 and cols["moe/layer1/router_z_loss"] == 1.0
    fields = telemetry_fields({"step": 3, "phase": "main", "loss": 2.0, **cols})
    assert fields == {"loss": 2.0, **cols}


def _moe_rows(n: int) -> list[dict]:
    return [
        {
            "step": s,
            "phase": "main",
            "moe/drop_rate": 0.1 / s,
            "moe/drop_rate_sender": 0.06 / s,
            "moe/drop_rate_receiver": 0.04 / s,
            "moe/load_cv": 1.0 / s,
            "moe/layer0/load_cv": 1.2 / s,
            "moe/layer1/load_cv": 0.8 / s,
        }
        for s in range(1, n + 1)
    ]


def test_the_moe_plot_is_a_png_from_rows_or_a_telemetry_query(tmp_path):
    from marin_assets.telemetry import TelemetryStore, TelemetryWriter
    from marin_assets.train.moe_plots import moe_telemetry_png

    png = moe_telemetry_png(_moe_rows(6))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    with TelemetryWriter(str(tmp_path), "r1") as w:
        for row in _moe_rows(6):
            w.log(row["step"], {k: v for k, v in row.items() if k.startswith("moe/")}, phase="main")
    frame = TelemetryStore(str(tmp_path)).query(run="r1", latest=True)
    assert moe_telemetry_png(frame)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no row has a moe/drop_rate"):
        moe_telemetry_png(rows(4))  # a dense run's rows


@pytest.mark.slow
def test_a_tiny_moe_runs_moe_telemetry_tokens_per_s_and_mfu_reach_the_store(caches, tiny_config, tmp_path):
    from marin_assets.model.flops import flops_per_token, peak_flops
    from marin_assets.telemetry import TelemetryStore
    from marin_assets.train.config import replace
    from marin_assets.train.loop import train

    config = replace(tiny_config, num_steps=4)
    root = str(tmp_path / "telemetry")
    result = train(config, caches, tmp_path / "run", telemetry_root=root, telemetry_run="moe-run")
    logged = read_metrics(result.metrics_path)
    frame = TelemetryStore(root).query(run="moe-run", latest=True)
    stored = {(m, s): v for m, s, v in frame.select("metric", "step", "value").iter_rows()}
    routed = config.tokens_per_step * config.model.top_k * config.model.n_layers
    per_token = flops_per_token(config.model, config.seq_len)
    for row in logged:
        for name in (*MOE_COLUMNS, "moe/layer0/load_cv", "moe/layer0/drop_rate"):
            assert stored[(name, row["step"])] == pytest.approx(row[name]), (name, row["step"])
        assert row["moe/drop_rate"] == pytest.approx(row["dropped"] / routed)
        assert row["moe/drop_rate"] == pytest.approx(row["moe/drop_rate_sender"] + row["moe/drop_rate_receiver"])
        assert 1.0 <= row["moe/load_max_over_mean"] <= config.model.n_routed_experts / config.model.top_k
        assert row["moe/load_cv"] >= 0.0 and row["moe/router_z_loss"] > 0.0
    assert "tokens_per_s" not in logged[0] and ("tokens_per_s", 1) not in stored  # step 1's interval holds the compile
    for row in logged[1:]:
        assert row["tokens_per_s"] > 0 and stored[("tokens_per_s", row["step"])] == pytest.approx(row["tokens_per_s"])
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * per_token / peak_flops().flops_per_s)
        assert stored[("mfu", row["step"])] == pytest.approx(row["mfu"])
