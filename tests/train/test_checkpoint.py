import json
import logging

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from marin_assets.train.checkpoints import checkpoint as ckpt


def state(v):
    return {
        "params": {"w": jnp.full((3, 2), v, jnp.float32), "b": jnp.arange(4, dtype=jnp.int32)},
        "opt": (jnp.float32(v), {"m": np.full((2,), v, ml_dtypes.bfloat16)}),
        "step": jnp.int32(int(v)),
    }


def test_roundtrip_exact_including_bfloat16(tmp_path):
    s = state(1.5)
    folder = ckpt.save(tmp_path, 7, s, {"data_position": {"batches": 7}})
    arrays, meta = ckpt.load(folder)
    back = ckpt.restore_like(state(0.0), arrays)
    assert meta["step"] == 7 and meta["data_position"] == {"batches": 7}
    assert back["opt"][1]["m"].dtype == ml_dtypes.bfloat16
    for a, b in zip(ckpt.flatten(s)[1], ckpt.flatten(back)[1]):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_newest_valid_skips_corrupt_with_warning(tmp_path, caplog):
    for step in (2, 4, 6):
        ckpt.save(tmp_path, step, state(step), {})
    (tmp_path / "step-000000006" / "state.npz").write_bytes(b"torn write")
    (tmp_path / "step-000000008").mkdir()  # killed before the marker
    with caplog.at_level(logging.WARNING):
        assert ckpt.latest_valid(tmp_path).name == "step-000000004"
    assert "step-000000006" in caplog.text and "step-000000008" in caplog.text
    with pytest.raises(ValueError, match="corrupt"):
        ckpt.load(tmp_path / "step-000000006")


def test_temporary_checkpoints_are_pruned_permanent_kept(tmp_path):
    ckpt.save(tmp_path, 1, state(1), {}, kind="temporary")
    ckpt.save(tmp_path, 2, state(2), {}, kind="permanent")
    ckpt.save(tmp_path, 3, state(3), {}, kind="temporary")
    ckpt.save(tmp_path, 4, state(4), {}, kind="temporary")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000000002", "step-000000004"]


def test_staging_leftovers_are_not_checkpoints(tmp_path):
    (tmp_path / ".staging-000000009-dead").mkdir(parents=True)
    ckpt.save(tmp_path, 3, state(3), {})
    assert ckpt.latest_valid(tmp_path).name == "step-000000003"
    assert not list(tmp_path.glob(".staging-*"))  # cleaned on the next commit


def test_structure_mismatch_is_a_clear_error(tmp_path):
    folder = ckpt.save(tmp_path, 1, state(1), {})
    arrays, _ = ckpt.load(folder)
    other = state(0.0)
    other["params"]["w"] = jnp.zeros((5, 2))
    with pytest.raises(ValueError, match=r"\['params'\]\['w'\].*expected float32\[5, 2\]"):
        ckpt.restore_like(other, arrays)
    assert json.loads((folder / "COMMITTED").read_text()).keys() == {"state.npz", "meta.json"}


@pytest.mark.parametrize(
    "marker",
    [
        "[]",
        "{}",
        "null",
        "5",
        '"x"',
        "{not json",
        '{"state.npz": "%s"}',
        '{"meta.json": "%s", "state.npz": 7}',
        '{"meta.json": "%s", "state.npz": "%s", "extra": "%s"}',
        '{"meta.json": "%s", "state.npz": "%s"}',
    ],
)
def test_marker_of_the_wrong_shape_is_not_a_checkpoint(tmp_path, caplog, marker):
    """A marker must list exactly state.npz and meta.json with their digests; anything else
    (empty, a list, files missing, an extra entry, wrong digests) is skipped with a warning and
    the older checkpoint is used, never a crash."""
    ckpt.save(tmp_path, 2, state(2), {})
    newer = ckpt.save(tmp_path, 4, state(4), {})
    (newer / "COMMITTED").write_text(marker.replace("%s", "0" * 64))
    with caplog.at_level(logging.WARNING):
        assert ckpt.latest_valid(tmp_path).name == "step-000000002"
    assert "step-000000004: not a valid checkpoint" in caplog.text
    with pytest.raises(ValueError, match="corrupt or incomplete"):
        ckpt.load(newer)


def test_marker_with_the_real_digests_is_valid(tmp_path):
    folder = ckpt.save(tmp_path, 4, state(4), {})
    good = json.loads((folder / "COMMITTED").read_text())
    (folder / "COMMITTED").write_text(json.dumps(dict(reversed(list(good.items())))))  # order does not matter
    assert ckpt.latest_valid(tmp_path) == folder


def test_checkpoints_on_an_fsspec_filesystem(caplog):
    """The same code on fsspec's memory filesystem (as on gs://): save, the COMMITTED marker
    last, latest_valid skipping a torn one, temporary pruning, load."""
    import fsspec

    root = "memory://ckpt-test/run/checkpoints"
    fs = fsspec.filesystem("memory")
    first = ckpt.save(root, 2, state(2), {"data_position": {"batches": 2}})
    assert first == "memory://ckpt-test/run/checkpoints/step-000000002"
    marker = json.loads(fs.cat(f"{first}/COMMITTED"))
    assert sorted(marker) == ["meta.json", "state.npz"]
    import hashlib

    assert marker["state.npz"] == hashlib.sha256(fs.cat(f"{first}/state.npz")).hexdigest()
    ckpt.save(root, 3, state(3), {}, kind="temporary")
    newest = ckpt.save(root, 4, state(4), {}, kind="temporary")
    assert ckpt.list_checkpoints(root) == [first, newest]  # step 3 (temporary) pruned by step 4
    fs.pipe(f"{newest}/state.npz", b"torn write")
    with caplog.at_level(logging.WARNING):
        assert ckpt.latest_valid(root) == first
    assert "step-000000004: not a valid checkpoint (state.npz does not match its checksum)" in caplog.text
    arrays, meta = ckpt.load(first)
    assert meta["step"] == 2 and meta["data_position"] == {"batches": 2}
    back = ckpt.restore_like(state(0.0), arrays)
    assert all(np.array_equal(a, b) for a, b in zip(ckpt.flatten(state(2))[1], ckpt.flatten(back)[1]))
    fs.rm("/ckpt-test", recursive=True)
    assert ckpt.latest_valid(root) is None and ckpt.list_checkpoints(root) == []


# -- the sharded format (sharded_checkpoint.py), one process ------------------------------------------


def sharded_state(v):
    return dict(state(v), empty=jnp.zeros((0, 3), jnp.float32), zeros=jnp.zeros((2, 2), jnp.float32))


def shardings_of(tree):
    import jax

    return jax.tree.map(lambda x: x.sharding, jax.tree.map(jnp.asarray, tree))


def test_sharded_roundtrip_is_exact_and_read_into_the_target_layout(tmp_path):
    import jax

    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    s = jax.tree.map(jnp.asarray, sharded_state(1.5))
    folder = sharded.start_save(tmp_path, 7, s, {"data_position": {"batches": 7}}).wait()
    assert ckpt.marker_problem(folder) is None and ckpt.is_sharded(folder) and not (folder / "state.npz").exists()
    marker = json.loads((folder / "COMMITTED").read_text())
    assert sorted(marker) == ["meta.json", "shards/process-00000.json"]
    arrays, meta = ckpt.load(folder)  # whole host arrays, as the tools read them
    assert meta["step"] == 7 and meta["format"] == sharded.FORMAT and meta["data_position"] == {"batches": 7}
    back = sharded.restore(folder, meta, sharded_state(0.0), shardings_of(s))
    assert back["opt"][1]["m"].dtype == ml_dtypes.bfloat16 and back["empty"].shape == (0, 3)
    for a, b, c in zip(ckpt.flatten(s)[1], ckpt.flatten(back)[1], ckpt.flatten(ckpt.restore_like(s, arrays))[1], strict=True):
        assert a.dtype == b.dtype == c.dtype and np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize("damage", ["chunk", "manifest_entry", "zarray"])
def test_a_damaged_sharded_checkpoint_is_skipped(tmp_path, caplog, damage):
    """Every chunk file is named, with its digest, by the manifest of the process that wrote it;
    a torn chunk, a manifest that leaves a file out, or lost metadata make the folder invalid."""
    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    sharded.start_save(tmp_path, 2, sharded_state(2), {}).wait()
    newer = sharded.start_save(tmp_path, 4, sharded_state(4), {}).wait()
    w = ckpt.load(newer)[1]["keys"].index("['params']['w']")
    if damage == "chunk":
        (newer / "arrays" / f"a{w}" / "0.0").write_bytes(b"torn")
        reason = f"arrays/a{w}/0.0 does not match its checksum"
    elif damage == "zarray":
        (newer / "arrays" / f"a{w}" / ".zarray").unlink()
        reason = f"arrays/a{w}/.zarray unreadable"
    else:  # a manifest (and the marker's digest of it) that no longer names a chunk
        manifest = newer / "shards" / "process-00000.json"
        files = json.loads(manifest.read_text())["files"]
        del files[f"arrays/a{w}/0.0"]
        manifest.write_text(json.dumps({"files": files}))
        marker = json.loads((newer / "COMMITTED").read_text())
        import hashlib

        marker["shards/process-00000.json"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
        (newer / "COMMITTED").write_text(json.dumps(marker))
        reason = f"no process wrote arrays/a{w}/0.0"
    with caplog.at_level(logging.WARNING):
        assert ckpt.latest_valid(tmp_path).name == "step-000000002"
    assert f"step-000000004: not a valid checkpoint ({reason}" in caplog.text


def test_sharded_marker_is_written_after_the_shards_and_training_goes_on(tmp_path, monkeypatch):
    """start_save returns once the shards are copied to host memory; until the background write has
    finished, the folder has no marker and the previous checkpoint is the newest valid one."""
    import threading

    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    first = sharded.start_save(tmp_path, 2, sharded_state(2), {}).wait()
    release, written = threading.Event(), threading.Event()
    real = sharded._write_pieces

    def slow(*args):
        files = real(*args)
        written.set()
        assert release.wait(30)
        return files

    monkeypatch.setattr(sharded, "_write_pieces", slow)
    live = jax_tree_of(4.0)
    pending = sharded.start_save(tmp_path, 4, live, {}, kind="temporary")
    live["params"]["w"] = live["params"]["w"].at[0, 0].set(-1.0)  # the caller goes on with its state
    assert written.wait(30) and not pending.done()
    folder = tmp_path / "step-000000004"
    assert any((folder / "arrays").rglob("0.0")) and not (folder / "COMMITTED").exists()
    assert ckpt.latest_valid(tmp_path) == first
    release.set()
    assert pending.wait() == folder and ckpt.latest_valid(tmp_path) == folder
    assert ckpt.load(folder)[0]["['params']['w']"][0, 0] == 4.0  # what was saved is the state at the call


def jax_tree_of(v):
    import jax

    return jax.tree.map(jnp.asarray, sharded_state(v))


def test_sharded_save_leaves_memory_filesystems_to_the_single_file_format():
    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    assert sharded.supported("/tmp/x") and sharded.supported("gs://bucket/run/checkpoints")
    assert not sharded.supported("memory://run/checkpoints")


def test_a_failed_sharded_write_raises_on_wait_and_commits_nothing(tmp_path, monkeypatch):
    from marin_assets.train.checkpoints import sharded_checkpoint as sharded

    first = sharded.start_save(tmp_path, 2, sharded_state(2), {}).wait()

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sharded, "_write_pieces", disk_full)
    pending = sharded.start_save(tmp_path, 4, sharded_state(4), {})
    with pytest.raises(RuntimeError, match="step-000000004 was not written: .*No space left on device"):
        pending.wait()
    assert not (tmp_path / "step-000000004" / "COMMITTED").exists() and ckpt.latest_valid(tmp_path) == first
