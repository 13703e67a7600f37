import json
import logging

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from marin_assets.train import checkpoint as ckpt


def state(v):
    return {"params": {"w": jnp.full((3, 2), v, jnp.float32), "b": jnp.arange(4, dtype=jnp.int32)},
            "opt": (jnp.float32(v), {"m": np.full((2,), v, ml_dtypes.bfloat16)}), "step": jnp.int32(int(v))}


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


@pytest.mark.parametrize("marker", ["[]", "{}", "null", "5", '"x"', "{not json",
                                    '{"state.npz": "%s"}', '{"meta.json": "%s", "state.npz": 7}',
                                    '{"meta.json": "%s", "state.npz": "%s", "extra": "%s"}',
                                    '{"meta.json": "%s", "state.npz": "%s"}'])
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
