"""Stop requests during training: SIGTERM/SIGINT, or a caller's stop check (the budget file's), end the
phase cleanly at a step, checkpointed."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.hooks import StepInfo

log = logging.getLogger(__name__)
# (phase, global step, tokens trained so far, tokens at the phase's last step) -> why to end the phase now, or None.
StopCheck = Callable[[str, int, int, int], "str | None"]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # Dagster's local run termination sends SIGINT
STOP_SIGNAL_NAMES = frozenset(s.name for s in STOP_SIGNALS)  # what ``stopped_by`` says after a signal


class StopSignals:
    """While training, SIGTERM/SIGINT ask the loop to checkpoint the step it is on and return
    (a clean, resumable end) instead of dying mid-step; a second signal aborts at once."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name} while stopping")
        self.received = signal.Signals(signum).name
        log.warning("%s received: checkpointing at the end of this step, then stopping", self.received)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def mark(self, info: StepInfo) -> None:
        """The stop-signal hook: a signal received so far makes this step the phase's last.
        Process 0's signal decides for all (the stop's checkpoint is a collective)."""
        if distributed.agree(self.received is not None):
            info.stopped_by = self.received or "process 0's signal"


class CheckedStop:
    """A caller's ``StopCheck``, asked at each permanent checkpoint step (``checkpoint_every_steps``)
    before the checkpoint hook: a reason ends the phase at that step, whose checkpoint is then its
    final one. So a condition the check reads (a cut budget) ends the phase within one checkpoint
    interval of the step it became true, in steps, not seconds. Process 0 asks for all."""

    def __init__(self, check: StopCheck, phase: str, every: int, tokens_at: Callable[[int], int]) -> None:
        self.check, self.phase, self.every, self.tokens_at = check, phase, every, tokens_at
        self.reason: str | None = None

    def __call__(self, info: StepInfo) -> None:
        if info.stopped_by is not None or info.step % self.every or info.step >= info.end_step:
            return
        reason = (
            self.check(self.phase, info.step, self.tokens_at(info.step), self.tokens_at(info.end_step))
            if distributed.is_writer()
            else None
        )
        if distributed.agree(reason is not None):
            self.reason = info.stopped_by = reason or "process 0's stop check"
            log.warning("stop check at step %d: %s", info.step, self.reason)
