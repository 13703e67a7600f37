"""The demo's summary states the scaling ladder's pre-registered prediction and its outcome."""

from __future__ import annotations

from demo.__main__ import render

DATAKIT = {
    "success": True,
    "shards": 47,
    "partitions": 526,
    "cache_hits": 0,
    "runs": 9,
    "up_to_date_waves": 0,
    "seconds": 58.0,
    "datasets_train_tokens": {"sotu": 100},
}


def test_the_summary_names_each_target_its_prediction_and_its_error():
    scaling = {
        "targets": {
            "x3": {
                "multiple": 3.0,
                "predicted": 2.1,
                "actual": 2.2,
                "relative_error": (2.1 - 2.2) / 2.2,
                "interval": None,
                "flops": 1.2e11,
                "width": 16,
            },
            "main": {
                "multiple": 9.718382592,
                "predicted": 2.5,
                "actual": 2.4,
                "relative_error": 0.1 / 2.4,
                "interval": None,
                "flops": 3.9e10,
                "width": 64,
            },
        },
        "passed": True,
        "bound": 0.05,
        "ladder_cost_fraction": 0.52,
    }
    text = render(
        {
            "datakit": DATAKIT,
            "success": True,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "scaling": scaling,
        }
    )
    x3, main, check = [line for line in text.splitlines() if "scaling ladder" in line]
    assert "x3 (3x the fitted compute) predicted loss 2.1000 before its run, actual 2.2000" in x3
    assert "relative error -4.55%, within the 5% bound" in x3 and "ladder compute 52% of the targets'" in x3
    assert "main (9.72x the fitted compute) predicted loss 2.5000 before its run, actual 2.4000" in main
    # the interval the actual was judged by: |2.5 - actual| / actual <= 5%
    assert "within the 5% bound: actual in [2.3810, 2.6316])" in main
    assert check.endswith("prediction_error check passed")


def test_each_target_is_judged_against_the_bound_on_its_own():
    """A target within the bound says so even when another one fails the check."""
    scaling = {
        "targets": {
            "x3": {"multiple": 3.0, "predicted": 2.652, "actual": 2.641, "relative_error": 0.0044},
            "main": {
                "multiple": 9.7,
                "predicted": 3.343,
                "actual": 2.913,
                "relative_error": 0.1475,
                "off_optimum": {"decades": 1.104, "ladder_reach_decades": 0.454, "extrapolated": True},
            },
        },
        "passed": False,
        "bound": 0.05,
        "ladder_cost_fraction": 1.01,
    }
    text = render(
        {
            "datakit": DATAKIT,
            "success": True,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "scaling": scaling,
        }
    )
    x3, main, off, check = [line for line in text.splitlines() if "scaling ladder" in line]
    assert "+0.44%, within the 5% bound" in x3 and "+14.75%, outside the 5% bound" in main
    # Only the target whose model sat past the ladder's runs says its prediction extrapolated.
    assert off.endswith(
        "main's model sat +1.10 decades from N*, past the ladder's runs (0.45): its prediction extrapolated the off-optimum rise"
    )
    assert check.endswith("prediction_error check FAILED")


def test_without_the_main_run_the_summary_says_the_comparison_waits():
    scaling = {"targets": {}, "waiting_for": ["train/demo"], "best_lr": 0.03, "seconds": 80.0}
    text = render(
        {
            "datakit": DATAKIT,
            "success": True,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "scaling": scaling,
        }
    )
    assert "scaling ladder: predictions frozen; the comparison waits for train/demo" in text


def test_the_summary_ends_with_the_main_runs_sample():
    sample = {"phase": "starling", "step": 81, "prompt": "To be, or not to be", "completion": " that is the"}
    text = render(
        {
            "datakit": DATAKIT,
            "success": True,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "sample": sample,
        }
    )
    (line,) = [line for line in text.splitlines() if line.strip().startswith("sample")]
    assert line.strip() == "sample of train/demo starling (step 81, greedy): 'To be, or not to be' -> ' that is the'"


def test_a_sample_that_could_not_be_made_is_said_not_hidden():
    text = render(
        {
            "datakit": DATAKIT,
            "success": True,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "sample": {"error": "checkpoint X records no tokenizer"},
        }
    )
    assert "  sample of train/demo: none (checkpoint X records no tokenizer)" in text.splitlines()


def test_the_summary_names_the_exported_folder():
    export = {"phase": "starling", "step": 81, "parameters": 120_384, "layout": "qwen3_moe", "path": "/a/export/demo/v/data"}
    text = render(
        {
            "datakit": DATAKIT,
            "success": True,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "export": export,
        }
    )
    (line,) = [line for line in text.splitlines() if line.strip().startswith("export")]
    assert line.strip() == (
        "export of train/demo starling (step 81, 120,384 parameters): Hugging Face qwen3_moe folder /a/export/demo/v/data"
    )


def test_an_export_that_failed_is_said_and_fails_the_demo():
    export = {"phase": "starling", "error": "export/demo starling: not exported: ModelConfig.n_shared_experts=1 ..."}
    text = render(
        {
            "datakit": DATAKIT,
            "success": False,
            "seconds": 200.0,
            "artifacts": "a",
            "dagster_home": "d",
            "event_log": "e",
            "export": export,
        }
    )
    assert text.splitlines()[1].startswith("demo: FAILED")
    assert f"  export of train/demo starling: FAILED ({export['error']})" in text.splitlines()
