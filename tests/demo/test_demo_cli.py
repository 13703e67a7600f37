"""`marin demo` runs the definition layer's driver (python -m demo) from the repository root."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from marin_assets.cli.demo import driver_command

ROOT = Path(__file__).resolve().parents[2]


def test_flags_pass_through_to_the_driver():
    args = argparse.Namespace(json=True, skip_training=True, skip_scaling=False)
    assert driver_command(args) == [sys.executable, "-m", "demo", "--json", "--skip-training"]


def test_outside_the_repository_root_it_says_where_to_run(tmp_path):
    marin = Path(sys.executable).with_name("marin")
    result = subprocess.run([str(marin), "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "run it from the repository root" in result.stderr


def test_the_driver_parses_the_same_flags():
    from demo.__main__ import parse_args

    args = parse_args(["--skip-training", "--skip-scaling", "--json"])
    assert (args.skip_training, args.skip_scaling, args.json) == (True, True, True)
