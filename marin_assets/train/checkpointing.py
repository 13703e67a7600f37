"""When a phase writes its checkpoints: the checkpoint hook and the collective save it makes.

Permanent checkpoints at every multiple of ``checkpoint_every_steps``, at the phase's last step
and at the step a stop signal ends it on; temporary ones (each save prunes the older
temporaries) once ``checkpoint_every_seconds`` have passed since the last save. The format is ``checkpoint.py``.
"""

from __future__ import annotations

import time

from marin_assets.train import checkpoint as ckpt
from marin_assets.train import mesh as meshlib
from marin_assets.train.emit import Emitter
from marin_assets.train.hooks import StepInfo
from marin_assets.train.restore import Run


class CheckpointCadence:
    """The checkpoint hook, registered for every step: like Levanter's checkpointer hook it keeps
    its own cadence, since the time-based one has to look at every step."""

    def __init__(self, run: Run, emitter: Emitter) -> None:
        self.run, self.emitter = run, emitter
        self.last_save = time.monotonic()

    def __call__(self, info: StepInfo) -> None:
        """Save at ``info.step`` if the cadence says so; process 0 decides for all (a save is a
        collective: every process gathers the state): its stop signal and its clock."""
        config = self.run.config
        permanent = info.step % config.checkpoint_every_steps == 0 or info.final
        if permanent or meshlib.agree(time.monotonic() - self.last_save >= config.checkpoint_every_seconds):
            self.emitter.sync()  # the metrics file and the store hold every step the checkpoint names
            save(self.run, info.step, "permanent" if permanent else "temporary")
            self.last_save = time.monotonic()


def save(run: Run, step: int, kind: str) -> None:
    """Every process gathers the state (a collective); process 0 writes it; all wait for the commit."""
    host = meshlib.host_state(run.state.to_dict())
    if meshlib.is_writer():
        ckpt.save(run.ckpt_root, step, host, run.meta(step), kind)
    meshlib.barrier(f"ckpt-{step}")
