"""`marin demo`: materialise the demo asset graph on the embedded default.

The demo driver belongs to the definition layer (demo/ at the repository root, next to
definitions.py), which the library never imports: this command runs it as
``python -m demo`` in the current directory, with the same flags.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from marin_assets.settings import artifact_prefix


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="materialise the demo asset graph (local files, SQLite, CPU)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--skip-training", action="store_true", help="skip the phase-controlled training run")
    parser.add_argument("--skip-scaling", action="store_true", help="skip the scaling-law ladder")
    parser.set_defaults(handler=run)


def driver_command(args: argparse.Namespace) -> list[str]:
    flags = [
        f
        for f, on in (("--json", args.json), ("--skip-training", args.skip_training), ("--skip-scaling", args.skip_scaling))
        if on
    ]
    return [sys.executable, "-m", "demo", *flags]


def run(args: argparse.Namespace) -> int:
    if not (os.path.isfile("definitions.py") and os.path.isfile(os.path.join("demo", "__main__.py"))):
        print("marin demo: definitions.py and demo/ not found here: run it from the repository root", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("DAGSTER_HOME", os.path.abspath(".dagster_home"))
    env["MARIN_PREFIX"] = artifact_prefix(env)
    os.makedirs(env["DAGSTER_HOME"], exist_ok=True)
    return subprocess.run(driver_command(args), env=env).returncode
