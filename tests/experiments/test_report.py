"""The report states the record's amendments (dated reasons), and has no such section without."""

from __future__ import annotations

import copy

from marin_assets.experiments.analysis import analyze, report_markdown
from marin_assets.experiments.record_files import record_from_dict
from tests.experiments.test_screen_e2e import RECORD


def _report(amendments=None) -> str:
    data = copy.deepcopy(RECORD)
    if amendments is not None:
        data["amendments"] = amendments
    record = record_from_dict(data, source="tiny_screen.yaml")
    # Losses on a known power law; control_harm needs twice the compute (speedup 0.5).
    rows = [
        {
            "arm": a.name,
            "budget": b,
            "seed": s,
            "flops": b,
            "steps": 10,
            "seconds": 0.0,
            "validation_loss": 2.0 + 40.0 * (b if a.name != "control_harm" else b / 2) ** -0.2 + 0.002 * s,
        }
        for a in record.all_arms()
        for b in record.budgets
        for s in a.seeds
    ]
    return report_markdown(record, analyze(record, rows))


def test_amendments_are_listed_in_the_report():
    text = _report([{"date": "2026-11-30", "reason": "control_harm was\n  inconclusive with 2 seeds"}])
    assert "## Amendments\n\n- 2026-11-30: control_harm was inconclusive with 2 seeds\n" in text
    assert "## Amendments" not in _report()
