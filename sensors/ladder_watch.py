"""The ladder watches the main run: the ``ladder_band`` check and the phase controller's band signal.

``LadderWatch`` reads the ladder's runs (a sweep asset's partitions in the artifact store: each
run's metrics.jsonl and its ``params`` count) and fits their expected trajectory at the main
run's size (``marin_assets.scaling.trajectory``), once per set of run versions. Two users:

- the ``ladder_band`` asset check (``sensors/ladder_band.py``, partitioned like the train
  asset): it runs in each phase's run after the phase materialises and judges all its steps;
- the phase controller (``phase_controller_sensor(..., watch=...)``), through ``watch_verdict`` on
  every tick: while a phase runs, on its live telemetry; once it has materialised, on all of it.

Each verdict is recorded with its plot: the check's as its evaluation on the phase's partition
(failed when outside), the controller's, when it changes, as an observation on that partition
(``ladder_watch``: inside/outside, reason, the action taken). (Not as runless check evaluations:
Dagster's event log keeps one runless evaluation per check and partition, a unique key on
(check, run id '', partition), so a second verdict on a phase would fail to store.) The
``BandSignal`` the controller gets carries
``LadderWatchSettings.action``: ``rollback`` ends the phase and restarts it (the loss spike's path
in ``decide``/``end_phase_now``), ``hold`` requests no next phase until the budget file's
``released_holds`` names the phase, ``warn`` only records. After ``max_rollbacks`` roll-backs of a
phase its rollback becomes a hold: the same config would most likely leave the band again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from marin_assets.model import count_params
from marin_assets.model.config import ModelConfig
from marin_assets.orchestration import png_markdown
from marin_assets.phases.controller import WatchVerdict
from marin_assets.phases.signals import BandSignal
from marin_assets.scaling.trajectory import (
    Curve,
    Expected,
    LadderWatchSettings,
    Verdict,
    check_trajectory,
    expected_trajectory,
)
from marin_assets.scaling.trajectory_plot import trajectory_png
from marin_assets.settings import artifact_prefix
from marin_assets.store import ArtifactStore
from marin_assets.telemetry import TelemetryStore
from marin_assets.train.metrics import read_metrics, telemetry_rows

CHECK_NAME = "ladder_band"
WATCHED_METRICS = ["tokens", "loss", "grad_norm", "dropped"]


def _default_store() -> ArtifactStore:
    return ArtifactStore(artifact_prefix())


@dataclasses.dataclass
class LadderWatch:
    """The ladder a run is watched against, and how.

    sweep_key, partitions: the ladder's runs (counts with ``params``, and a metrics.jsonl of
      per-step rows in the artifact's data dir); one not materialised yet is left out and named.
    model: the main run's ModelConfig fields; N is its active parameter count, as the ladder's
      planner counts N; vocab_size 0 means the ``vocab_from`` asset's counts.
    """

    sweep_key: str
    partitions: Sequence[str]
    model: Mapping[str, Any]
    settings: LadderWatchSettings = dataclasses.field(default_factory=LadderWatchSettings)
    vocab_from: str = "mixture"
    store: Callable[[], ArtifactStore] = _default_store
    _fitted: dict = dataclasses.field(default_factory=dict, repr=False)

    def target_params(self, store: ArtifactStore) -> float:
        model = dict(self.model)
        if not model.get("vocab_size"):
            ref = store.read_pointer(self.vocab_from, None)
            if ref is None or not ref.counts.get("vocab_size"):
                raise LookupError(f"the main run's vocabulary: {self.vocab_from} is not materialised yet")
            model["vocab_size"] = int(ref.counts["vocab_size"])
        return float(count_params(ModelConfig(**model))[1])

    def reference(self) -> tuple[Expected, list[Curve], str] | str:
        """(expected trajectory, the ladder's runs, a note on runs left out), or why there is none yet."""
        store = self.store()
        try:
            params = self.target_params(store)
        except LookupError as err:
            return f"no ladder trajectory yet: {err}"
        refs = {k: store.read_pointer(self.sweep_key, k) for k in self.partitions}
        key = (params, tuple(sorted((k, r.version) for k, r in refs.items() if r is not None)))
        if key not in self._fitted:
            self._fitted = {key: self._fit(refs, params)}  # one ladder state at a time
        return self._fitted[key]

    def _fit(self, refs: Mapping[str, Any], params: float) -> tuple[Expected, list[Curve], str] | str:
        curves, left_out = [], sorted(k for k, r in refs.items() if r is None)
        for k, ref in sorted((k, r) for k, r in refs.items() if r is not None):
            rows = read_metrics(f"{ref.data_path.rstrip('/')}/metrics.jsonl")
            if rows and ref.counts.get("params"):
                curves.append(Curve.from_rows(f"{self.sweep_key}[{k}]", float(ref.counts["params"]), rows))
            else:
                left_out.append(f"{k} (no metrics.jsonl rows or params)")
        note = f"left out {len(left_out)} of {len(refs)} ladder runs: {', '.join(left_out)}" if left_out else ""
        try:
            return expected_trajectory(curves, params, self.settings), curves, note
        except ValueError as err:
            return f"no ladder trajectory yet: {err}" + (f" ({note})" if note else "")


@dataclasses.dataclass(frozen=True)
class PhaseView:
    """The phase being judged, as the controller or the phase's run knows it."""

    phase: str
    token_budget: int  # the phase's planned tokens: the fraction of the phase is judged against it
    attempt: int
    tokens_before: int  # the run's tokens when the phase started
    telemetry_run: str
    since: float | None  # the run's start (unix s): rows of an earlier attempt are older
    final: bool  # the phase has materialised: all its steps are in


@dataclasses.dataclass(frozen=True)
class Judged:
    verdict: Verdict
    expected: Expected
    main: Curve
    ladder: list[Curve]
    note: str


def judge(watch: LadderWatch, view: PhaseView, telemetry_root: str) -> Judged | str:
    """The phase's verdict, or why there is none (no ladder trajectory yet, no step logged yet, or
    unreadable ladder runs or telemetry: named, so the watch never fails a phase's run or stops the
    controller)."""
    try:
        return _judge(watch, view, telemetry_root)
    except (ValueError, LookupError, OSError) as err:
        return f"could not judge {view.phase}: {type(err).__name__}: {err}"


def _judge(watch: LadderWatch, view: PhaseView, telemetry_root: str) -> Judged | str:
    reference = watch.reference()
    if isinstance(reference, str):
        return reference
    expected, ladder, note = reference

    frame = TelemetryStore(telemetry_root).query(
        run=view.telemetry_run, metric=WATCHED_METRICS, times=(view.since, None), latest=True
    )
    rows = [r for r in telemetry_rows(frame) if "tokens" in r]
    if not rows:
        return f"no step of {view.telemetry_run} in the telemetry store yet"
    main = Curve.from_rows(
        view.telemetry_run, expected.params, rows, start_tokens=view.tokens_before, planned_tokens=view.token_budget
    )
    return Judged(check_trajectory(expected, main, watch.settings), expected, main, ladder, note)


def watch_verdict(watch: LadderWatch, view: PhaseView, telemetry_root: str, released_holds: Sequence[str]) -> WatchVerdict | None:
    """The phase controller's view of the watch's verdict on ``view`` (None: not judged yet, or unreadable): its band
    signal for ``decide``/``end_phase_now`` (None: inside, or a hold ``released_holds`` names), and what to record
    with the action taken. The controller records a verdict unlike the last it recorded for this phase attempt
    (``slot``), after it has acted: drawing the plot took 1.7 of a 1.9 s tick here, time a running phase would
    otherwise train on past a decision to end it."""
    judged = judge(watch, view, telemetry_root)
    if isinstance(judged, str):
        return None
    verdict = judged.verdict
    signal = None if verdict.inside else _signal(watch.settings, verdict, view, released_holds)
    action = "none (inside)" if verdict.inside else (signal.action if signal else "none (hold released)")
    return WatchVerdict(
        view.phase,
        slot=f"{view.phase}#{view.attempt}",
        said=f"{verdict.inside}:{verdict.first_step}:{action}",
        signal=signal,
        render=lambda: verdict_metadata(judged, view, action, watch.settings),
    )


def _signal(settings: LadderWatchSettings, verdict: Verdict, view: PhaseView, released: Sequence[str]) -> BandSignal | None:
    action, reason = settings.action, verdict.reason
    if action == "rollback" and view.attempt >= settings.max_rollbacks:
        action, reason = "hold", f"{reason} (rolled back {view.attempt} times already: holding)"
    if action == "hold" and view.phase in released:
        return None
    return BandSignal(reason, action, verdict.first_step)


def verdict_metadata(judged: Judged, view: PhaseView, action: str, settings: LadderWatchSettings) -> dict:
    """What a verdict records: the verdict per metric, the expectation it was judged by, the plot."""
    verdict, expected = judged.verdict, judged.expected
    png = trajectory_png(expected, judged.main, verdict, settings, judged.ladder)
    summary = {
        "params": expected.params,
        "law": dict(expected.law),
        "loss_sigma": expected.loss_sigma,
        "loss_band": max(settings.loss_floor, settings.loss_sigmas * expected.loss_sigma),
        "ladder_params": list(expected.params_range),
        "ladder_tokens": list(expected.tokens_range),
        "ladder_runs": list(expected.runs),
        "points": expected.points,
        "not_finite": expected.not_finite,
        "settings": dataclasses.asdict(settings),
    }
    return {
        "ladder_watch": "inside" if verdict.inside else "outside",
        "reason": verdict.reason,
        "action": action,
        "first_step_outside": verdict.first_step if verdict.first_step is not None else -1,
        "judged": f"{'final' if view.final else 'live'}, attempt {view.attempt}",
        "verdict": dg.MetadataValue.json(verdict.as_dict()),
        "expected": dg.MetadataValue.json(summary),
        **({"ladder_runs_left_out": judged.note} if judged.note else {}),
        "trajectory": png_markdown("Main run against the ladder's band", png),
    }
