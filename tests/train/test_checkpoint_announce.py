"""``train(on_checkpoint=...)`` announces a checkpoint only once its COMMITTED marker is written, and the local
backend hands each announcement to the thread that runs the steps (where a Dagster context may be used)."""

import threading
import types

from marin_assets.orchestration.training_backends import LocalTrainingBackend, TrainSpec
from marin_assets.train.checkpoints import checkpoint as ckpt


def test_the_local_backend_announces_every_committed_checkpoint_on_the_training_thread(caches, tiny_config, tmp_path):
    seen = []

    def on_checkpoint(folder, step):
        seen.append((step, ckpt.is_valid(folder), threading.current_thread() is threading.main_thread()))

    context = types.SimpleNamespace(log=types.SimpleNamespace(info=lambda message: None))
    spec = TrainSpec(tiny_config, caches, str(tmp_path / "run"), telemetry_root=str(tmp_path / "telemetry"))
    outcome = LocalTrainingBackend().run_announcing(context, spec, on_checkpoint)
    assert outcome.final_step == 12
    # Every 4 steps and the last: each verified when announced, each announced on the caller's thread.
    assert seen == [(4, True, True), (8, True, True), (12, True, True)]
