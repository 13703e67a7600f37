"""The input-folder containment check against a sibling whose name extends the input's:
`in/link.jsonl -> ../in-evil/secret.jsonl`. "/x/in-evil/secret.jsonl".startswith("/x/in") is
true, so a string-prefix check would read the sibling's file; every check must compare path
components (issue 35). Both entry points are pinned: ``marin datakit run --input`` scanning
(input_scan.scan_input) and the watched folder (watched_dir.scan, what sensors/user_shards.py
and sources/user read), plus the store helper the watched folder resolves names with."""

from __future__ import annotations

import json
import os

import pytest

from marin_assets.datakit.input_scan import local_entry_problem, scan_input
from marin_assets.datakit.watched_dir import scan
from marin_assets.store.fsutil import real_path_inside


@pytest.fixture
def folders(tmp_path):
    """tmp/in holds own.jsonl, a link to its own sub/kept.jsonl (inside: read) and a link into
    the sibling tmp/in-evil (outside: skipped); tmp/in-evil holds secret.jsonl."""
    inside, evil = tmp_path / "in", tmp_path / "in-evil"
    inside.mkdir()
    evil.mkdir()
    (inside / "sub").mkdir()
    (evil / "secret.jsonl").write_text(json.dumps({"text": "not yours"}) + "\n")
    (inside / "own.jsonl").write_text(json.dumps({"text": "yours"}) + "\n")
    (inside / "sub" / "kept.jsonl").write_text(json.dumps({"text": "also yours"}) + "\n")
    os.symlink(os.path.join("..", "in-evil", "secret.jsonl"), inside / "link.jsonl")  # relative, as users make them
    os.symlink(inside / "sub" / "kept.jsonl", inside / "inner.jsonl")
    return inside, evil


def test_the_sibling_really_shares_the_prefix(folders):
    inside, evil = folders
    assert os.path.realpath(evil / "secret.jsonl").startswith(os.path.realpath(inside))  # what a prefix check sees


def test_input_scan_skips_and_counts_a_link_into_the_sibling(folders):
    inside, evil = folders
    files, skipped = scan_input(str(inside))
    assert [os.path.relpath(f, inside) for f in files] == ["inner.jsonl", "own.jsonl", os.path.join("sub", "kept.jsonl")]
    assert list(skipped) == ["link.jsonl"]
    assert skipped["link.jsonl"] == (
        f"a symlink to {os.path.realpath(evil / 'secret.jsonl')}, outside the input (links are followed only inside it)"
    )


def test_a_single_linked_file_given_as_input_is_judged_against_its_own_folder(folders):
    inside, _ = folders
    assert local_entry_problem(str(inside / "link.jsonl"), os.path.realpath(inside)).startswith("a symlink to ")
    assert local_entry_problem(str(inside / "inner.jsonl"), os.path.realpath(inside)) is None


def test_watched_folder_skips_and_names_a_link_into_the_sibling(folders):
    inside, evil = folders
    usable, skipped = scan(str(inside))
    assert sorted(usable) == ["inner.jsonl", "own.jsonl"]  # a folder (sub/) is not watched; a link into it is read
    assert skipped == {
        "link.jsonl": f"a symlink to {os.path.realpath(evil / 'secret.jsonl')}, outside the input "
        "(links are followed only inside it)"
    }


def test_real_path_inside_refuses_the_sibling_and_accepts_its_own_files(folders):
    inside, evil = folders
    with pytest.raises(ValueError, match="outside the directory"):
        real_path_inside(str(inside), "link.jsonl")
    with pytest.raises(ValueError, match="outside the directory"):
        real_path_inside(str(inside), os.path.join("..", "in-evil", "secret.jsonl"))
    assert real_path_inside(str(inside), "inner.jsonl") == os.path.realpath(inside / "sub" / "kept.jsonl")
