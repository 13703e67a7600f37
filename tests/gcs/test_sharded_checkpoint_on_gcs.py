"""Sharded checkpoints (marin_assets/train/checkpoints/sharded_checkpoint.py) on the GCS emulator: the save commits,
restores, and a torn shard makes the previous checkpoint the newest valid one. Here, not beside the
multi-process tests in tests/train/, so the worker's one session GCS server (tests/gcs/conftest.py) serves
it: a second server started by an imported fixture would repoint every client's environment at itself."""

from __future__ import annotations

import numpy as np
import pytest

from marin_assets.train.checkpoints import checkpoint as ckpt


@pytest.mark.slow
def test_sharded_checkpoint_on_the_gcs_emulator(gcs_prefix):
    """tensorstore's gcs kvstore writes the shards, gcsfs the manifests and the marker."""
    import jax
    import jax.numpy as jnp

    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    root = f"{gcs_prefix}/run/checkpoints"
    state = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "step": jnp.int32(5)}
    folder = sharded.start_save(root, 5, state, {"data_position": {"batches": 5}}).wait()
    assert folder == f"{root}/step-000000005" and ckpt.latest_valid(root) == folder
    meta = sharded.read_meta(folder)
    back = sharded.restore(folder, meta, state, jax.tree.map(lambda x: x.sharding, state))
    assert np.array_equal(back["w"], state["w"]) and int(back["step"]) == 5
    assert ckpt.load(folder)[0]["['w']"].tolist() == np.arange(12).reshape(3, 4).tolist()
    newer = sharded.start_save(root, 6, state, {}, kind="temporary").wait()
    assert ckpt.latest_valid(root) == newer
    import fsspec

    w = sharded.read_meta(newer)["keys"].index("['w']")
    fsspec.filesystem("gs").pipe(f"{newer}/arrays/a{w}/0.0", b"torn")
    assert ckpt.latest_valid(root) == folder
