"""Reruns without a human: when code, config defaults or an upstream version change."""

from __future__ import annotations

import dagster as dg


def rerun_on_change() -> dg.AutomationCondition:
    """Materialise when missing, when an upstream got a new version, or when this asset's
    code_version (which folds in its default config) changed since the last run."""
    return dg.AutomationCondition.eager() | dg.AutomationCondition.code_version_changed().since_last_handled()
