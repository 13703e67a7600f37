"""The ``ladder_band`` asset check: a phase against the ladder's band, in the phase's own run.

Partitioned like the train asset, so it runs after each phase materialises (the train job selects
the asset's group, which takes its checks along) and judges all the phase's steps with the
``LadderWatch`` the phase controller uses (sensors/ladder_watch.py). Not blocking: what leaving
the band means is the controller's ``LadderWatchSettings.action``. A phase it cannot judge (no
ladder runs yet, a cache hit that trained nothing in this run) passes with a warning saying why.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from marin_assets.phases.plan import phase_telemetry_run
from marin_assets.scaling.trajectory import LadderWatchSettings
from marin_assets.telemetry import default_root as default_telemetry_root
from sensors.ladder_watch import CHECK_NAME, LadderWatch, PhaseView, judge, verdict_metadata


def _severity(settings: LadderWatchSettings) -> dg.AssetCheckSeverity:
    return dg.AssetCheckSeverity.WARN if settings.action == "warn" else dg.AssetCheckSeverity.ERROR


def ladder_band_check(
    train_asset: dg.AssetsDefinition, watch: LadderWatch, run: str, telemetry_root: Callable[[], str] = default_telemetry_root
) -> dg.AssetChecksDefinition:
    """``ladder_band`` on ``train_asset`` (whose phases log to ``phase_telemetry_run(run, phase)``):
    in each phase's run, after the phase materialises, its steps against the ladder's band.
    Not blocking: the controller decides what leaving the band means (``LadderWatchSettings.action``)."""
    op_name = train_asset.op.name

    def _ladder_band(context) -> dg.AssetCheckResult:  # (no annotation: Dagster reads it, and here it is a string)
        view = _view_of_this_run(context, train_asset.key, op_name, run)
        judged = judge(watch, view, telemetry_root()) if isinstance(view, PhaseView) else view
        if isinstance(judged, str) or isinstance(view, str):
            why = judged if isinstance(judged, str) else str(view)
            return dg.AssetCheckResult(
                passed=True,
                severity=dg.AssetCheckSeverity.WARN,
                description=f"not judged: {why}",
                metadata={"ladder_watch": "not judged", "reason": why},
            )
        metadata = verdict_metadata(judged, view, watch.settings.action, watch.settings)
        return dg.AssetCheckResult(
            passed=judged.verdict.inside, severity=_severity(watch.settings), description=judged.verdict.reason, metadata=metadata
        )

    with warnings.catch_warnings():  # a partitioned check is a Dagster preview; the check is one per phase, as the asset
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.asset_check(
            asset=train_asset,
            name=CHECK_NAME,
            partitions_def=train_asset.partitions_def,
            description="the phase's loss, gradient norm and drop rate stay inside the ladder's "
            "expected trajectory at the main run's size",
        )(_ladder_band)


def _view_of_this_run(context: dg.AssetCheckExecutionContext, train_key: dg.AssetKey, op_name: str, run: str) -> PhaseView | str:
    """The phase this run materialised: its spec and attempt from the run's config, the tokens before
    it from its materialisation, the run's start as the telemetry cut-off."""
    phase = context.partition_key
    config = _mapping(_mapping(_mapping(context.run.run_config).get("ops")).get(op_name)).get("config")
    phase_config = _mapping(_mapping(config).get("phase"))
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=train_key, asset_partitions=[phase]), limit=1
    ).records
    event = records[0].event_log_entry if records else None
    materialized = event.asset_materialization if event is not None and event.run_id == context.run.run_id else None
    if materialized is None or "token_budget" not in phase_config:
        return f"this run did not materialise phase {phase} with a phase config"
    meta = {k: v.value for k, v in materialized.metadata.items()}
    try:
        before = int(str(meta["count/tokens_trained"])) - int(str(meta["count/phase_tokens"]))
    except (KeyError, ValueError):
        return f"phase {phase}'s materialisation has no integer count/tokens_trained and count/phase_tokens"
    record = context.instance.get_run_record_by_id(context.run.run_id)
    return PhaseView(
        phase,
        int(phase_config["token_budget"]),
        int(_mapping(config).get("attempt", 0)),
        before,
        phase_telemetry_run(run, phase),
        record.start_time if record else None,
        final=True,
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
