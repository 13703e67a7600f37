"""SIGTERM ends a phase cleanly at a checkpoint; every step's metrics reach the telemetry store."""

import json
import os
import signal

import pytest

from marin_assets.telemetry import TelemetryStore
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.config import replace
from marin_assets.train.loop import train
from marin_assets.train.metrics import read_metrics


def _signal_at(step: int, signum=signal.SIGTERM):
    def log_fn(row):
        if row["step"] == step:
            os.kill(os.getpid(), signum)

    return log_fn


@pytest.mark.slow  # a phase stopped by a signal, then its successor: two trainings
def test_sigterm_checkpoints_the_step_and_the_successor_starts_after_it(caches, tiny_config, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    store = tmp_path / "telemetry"
    config = replace(tiny_config, phase="phoenix")  # 12 steps, checkpoints every 4
    # Row 5 is written while step 6 runs, so the loop sees the signal after step 6.
    result = train(
        config, caches, tmp_path / "phoenix", log_fn=_signal_at(5), telemetry_root=str(store), telemetry_run="demo-phoenix"
    )
    assert result.stopped_by == "SIGTERM" and result.final_step == 6
    assert result.stop_message == "stopped at step 6 by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
    assert ckpt.latest_valid(tmp_path / "phoenix" / "checkpoints").name == "step-000000006"
    assert 6 - 4 < config.checkpoint_every_steps  # ended within one interval of the last regular one
    saved = json.loads((tmp_path / "phoenix" / "train_result.json").read_text())
    assert saved["stopped_by"] == "SIGTERM" and saved["final_step"] == 6
    assert [r["step"] for r in read_metrics(result.metrics_path)] == [1, 2, 3, 4, 5, 6]
    # the live store holds the same steps, flattened (counts as counts.<k>)
    frame = TelemetryStore(str(store)).query(run="demo-phoenix", latest=True)
    assert sorted(set(frame["step"])) == [1, 2, 3, 4, 5, 6]
    metrics = set(frame["metric"])
    assert {"loss", "lr", "grad_norm", "tokens", "skipped", "counts.skipped_spike"} <= metrics
    losses = frame.filter(frame["metric"] == "loss").sort("step")["value"].to_list()
    assert losses == pytest.approx([r["loss"] for r in read_metrics(result.metrics_path)])
    assert set(frame["phase"]) == {"phoenix"}
    assert result.loss_curve_png.exists() and result.loss_curve_png.stat().st_size > 1000

    successor = train(
        replace(tiny_config, phase="starling", num_steps=3),
        caches,
        tmp_path / "starling",
        warm_start=tmp_path / "phoenix",
        telemetry_root=str(store),
        telemetry_run="demo-starling",
    )
    assert successor.phase_start_step == 6 and successor.stopped_by is None
    assert [r["step"] for r in read_metrics(successor.metrics_path)] == [7, 8, 9]  # checkpoint step + 1 first
    assert successor.final_step == 9


@pytest.mark.slow  # two trainings (a SIGINT, an error)
def test_sigint_stops_the_same_way_and_an_error_still_flushes_telemetry(caches, tiny_config, tmp_path):
    store = tmp_path / "telemetry"
    result = train(
        replace(tiny_config, checkpoint_every_steps=8),
        caches,
        tmp_path / "a",
        log_fn=_signal_at(2, signal.SIGINT),
        telemetry_root=str(store),
        telemetry_run="a",
    )
    assert (result.stopped_by, result.final_step) == ("SIGINT", 3)
    assert ckpt.latest_valid(tmp_path / "a" / "checkpoints").name == "step-000000003"

    def explode(row):
        if row["step"] == 3:
            raise RuntimeError("boom at 3")

    with pytest.raises(RuntimeError, match="boom at 3"):
        train(tiny_config, caches, tmp_path / "b", log_fn=explode, telemetry_root=str(store), telemetry_run="b")
    # steps 1-3 were logged before the error; closing on the way out wrote them
    assert sorted(set(TelemetryStore(str(store)).query(run="b", metric="loss")["step"])) == [1, 2, 3]


def test_no_signal_no_stop(caches, tiny_config, tmp_path):
    result = train(replace(tiny_config, num_steps=4), caches, tmp_path / "c", telemetry_root=str(tmp_path / "t"))
    assert result.stopped_by is None and result.stop_message is None and result.final_step == 4
    assert result.telemetry_run.startswith("c-main-") and len(result.telemetry_run) == len("c-main-") + 8
    loss = TelemetryStore(str(tmp_path / "t")).query(run=result.telemetry_run, metric="loss")
    assert sorted(set(loss["step"])) == [1, 2, 3, 4]


def test_default_telemetry_run_is_valid_and_distinct_per_out_dir(tmp_path):
    from marin_assets.store.names import validate_segment
    from marin_assets.train.loop import default_telemetry_run

    a, b = default_telemetry_run(tmp_path / "x" / ".work", "kestrel"), default_telemetry_run(tmp_path / "y" / ".work", "kestrel")
    assert a.startswith("work-kestrel-") and b.startswith("work-kestrel-") and a != b
    assert default_telemetry_run(tmp_path / "x" / ".work", "kestrel") == a  # a resume logs under the same run
    for out, phase in ((".work", "main"), ("a b..c", "p/q"), ("...", "..")):
        validate_segment(default_telemetry_run(tmp_path / out, phase), "run")


def test_a_signal_at_the_last_step_leaves_the_completed_phase_alone(caches, tiny_config, tmp_path, caplog):
    # row 4 (the last) is written at the final checkpoint: the signal arrives after the last step ran
    result = train(
        replace(tiny_config, num_steps=4), caches, tmp_path / "d", log_fn=_signal_at(4), telemetry_root=str(tmp_path / "t")
    )
    assert result.stopped_by is None and result.final_step == 4
    assert "arrived after the last step (4): the phase is complete" in caplog.text
    assert ckpt.latest_valid(tmp_path / "d" / "checkpoints").name == "step-000000004"
