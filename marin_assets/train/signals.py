"""SIGTERM/SIGINT during training: checkpoint the step the loop is on and end the phase cleanly."""

from __future__ import annotations

import logging
import signal
import threading

from marin_assets.train import processes
from marin_assets.train.hooks import StepInfo

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # Dagster's local run termination sends SIGINT


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
        if processes.agree(self.received is not None):
            info.stopped_by = self.received or "process 0's signal"
