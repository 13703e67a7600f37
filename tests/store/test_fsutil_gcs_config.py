"""Importing the store turns gcsfs's never-expiring listings cache off, keeping the user's other gs settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from marin_assets.store.fsutil import _gcs_listings_cache_off


def _gs_conf_after_import(env: dict[str, str]) -> dict:
    code = "import json, fsspec.config, marin_assets.store.fsutil; print(json.dumps(fsspec.config.conf.get('gs')))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FSSPEC_")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_importing_the_store_turns_the_listings_cache_off_and_keeps_other_gs_settings():
    conf = _gs_conf_after_import({"FSSPEC_GS": json.dumps({"token": "anon", "project": "p"})})
    assert conf == {"token": "anon", "project": "p", "use_listings_cache": False}
    assert _gs_conf_after_import({}) == {"use_listings_cache": False}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {"gs": {"use_listings_cache": False}}),
        ({"gs": {"use_listings_cache": True, "cache_timeout": 5}}, {"gs": {"use_listings_cache": True, "cache_timeout": 5}}),
        ({"gs": {"use_listings_cache": "false"}}, {"gs": {"use_listings_cache": False}}),  # FSSPEC_GS_USE_LISTINGS_CACHE=false
        ({"gs": {"use_listings_cache": " True"}}, {"gs": {"use_listings_cache": True}}),
        ({"s3": {"anon": True}}, {"s3": {"anon": True}, "gs": {"use_listings_cache": False}}),
    ],
)
def test_an_explicit_user_choice_wins_and_env_strings_are_parsed(given, expected):
    _gcs_listings_cache_off(given)
    assert given == expected


def test_an_unreadable_env_flag_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"^FSSPEC_GS_USE_LISTINGS_CACHE='maybe': expected true or false$"):
        _gcs_listings_cache_off({"gs": {"use_listings_cache": "maybe"}})
