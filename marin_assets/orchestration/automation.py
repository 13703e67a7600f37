"""Reruns without a human: when code, config defaults or an upstream version change."""

from __future__ import annotations

import dagster as dg


def rerun_on_change() -> dg.AutomationCondition:
    """Materialise when missing, when an upstream got a new version, or when this asset's
    code_version (which folds in its default config) changed since the last run."""
    # dagster annotates since_last_handled's self as AutomationCondition[AssetOrCheckKey], an invariant
    # parameter, so the AssetKey condition code_version_changed() returns does not match it
    changed = dg.AutomationCondition.code_version_changed().since_last_handled()  # pyright: ignore[reportAttributeAccessIssue]
    return dg.AutomationCondition.eager() | changed
