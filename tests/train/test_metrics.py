"""metrics.jsonl on a local disk and on an object store (fsspec memory://): the same rows,
the same truncation on resume, the same torn-line rule."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest
from hypothesis import given, settings, strategies as st

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
@given(st.lists(st.fixed_dictionaries({"step": st.integers(0, 10**6), "loss": st.floats(allow_nan=False)}),
                max_size=8), st.data())
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
