"""Suite-wide rules.

Under CI (``CI=true``, as `.ci/run` runs) a skipped test is a failed test: a missing
PostgreSQL, Chromium or anchor file must turn CI red, not quietly shrink what it checked.
Locally a skip stays a skip, with its reason (``make test`` prints them with ``-rs``).
"""

from __future__ import annotations

import os

import pytest


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {reason}"
