"""When a phase writes its checkpoints: the checkpoint hook and the collective save it starts.

Permanent checkpoints at every multiple of ``checkpoint_every_steps``, at the phase's last step
and at the step a stop signal ends it on; temporary ones (each save prunes the older
temporaries) once ``checkpoint_every_seconds`` have passed since the last save.

On a local disk or ``gs://`` a save is sharded and asynchronous (``sharded_checkpoint.py``): every
process copies the shards it owns to host memory and training goes on while a background thread
writes them; the next save, and the end of the phase, first wait for the previous one's commit.
Elsewhere (``memory://``) the state is gathered and process 0 writes one file (``checkpoint.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from marin_assets.store.fsutil import child
from marin_assets.train.checkpoints import checkpoint as ckpt
from marin_assets.train.checkpoints import sharded_checkpoint as sharded
from marin_assets.train.distributed import hosts as distributed
from marin_assets.train.distributed import mesh as meshlib
from marin_assets.train.emit import Emitter
from marin_assets.train.hooks import StepInfo
from marin_assets.train.restore import Run

OnCheckpoint = Callable[[Path | str, int], None]  # (checkpoint folder, step), once its COMMITTED marker is written


class CheckpointCadence:
    """The checkpoint hook, registered for every step: like Levanter's checkpointer hook it keeps
    its own cadence, since the time-based one has to look at every step."""

    def __init__(self, run: Run, emitter: Emitter, on_checkpoint: OnCheckpoint | None = None) -> None:
        self.run, self.emitter, self.on_checkpoint = run, emitter, on_checkpoint
        self.last_save = time.monotonic()
        self.pending: sharded.PendingSave | None = None

    def __call__(self, info: StepInfo) -> None:
        """Start a save at ``info.step`` if the cadence says so; process 0 decides for all (a save is
        a collective): its stop signal and its clock."""
        config = self.run.config
        permanent = info.step % config.checkpoint_every_steps == 0 or info.final
        if permanent or distributed.agree(time.monotonic() - self.last_save >= config.checkpoint_every_seconds):
            self.wait()  # one save in flight at a time: checkpoints commit in step order
            self.emitter.sync()  # the metrics file and the store hold every step the checkpoint names
            self.pending = save(self.run, info.step, "permanent" if permanent else "temporary", self.on_checkpoint)
            self.last_save = time.monotonic()

    def wait(self, info: StepInfo | None = None) -> None:
        """Block until the save in flight (if any) is committed; raise its error. Also a hook: run before a
        caller's hooks, they see the step's checkpoint committed."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.wait()


def save(run: Run, step: int, kind: str, on_checkpoint: OnCheckpoint | None = None) -> sharded.PendingSave:
    """Start the checkpoint of ``step`` on every process (a collective); ``wait()`` on the result commits it.
    ``on_checkpoint`` runs on process 0 once the marker is written (on the writer's background thread for
    a sharded save): never for a save that does not commit, so a listener is told only of real checkpoints."""
    state, name = run.state.to_dict(), f"step-{step:09d}"
    folder = child(run.ckpt_root, name)

    def committed() -> None:
        ckpt.prune_temporary(run.ckpt_root, name)
        if on_checkpoint is not None:
            on_checkpoint(folder, step)

    if sharded.supported(run.ckpt_root):
        return sharded.start_save(run.ckpt_root, step, state, run.meta(step), kind, on_commit=committed)
    host = meshlib.host_state(state)  # a store tensorstore cannot write: gather, process 0 writes one file
    if distributed.is_writer():
        ckpt.save(run.ckpt_root, step, host, run.meta(step), kind)  # prunes the older temporaries itself
        if on_checkpoint is not None:
            on_checkpoint(folder, step)
    distributed.barrier(f"ckpt-{step}")
    return sharded.PendingSave(folder, None)
