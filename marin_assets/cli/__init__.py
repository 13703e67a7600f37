"""The ``marin`` command line.

Every module in this package that defines ``register(subparsers)`` adds one subcommand,
so each area (datakit, train, scaling, cluster, demo) owns its own file and the
dispatcher never changes when a new one arrives.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="marin",
        description="Reproducible LM training as a content-versioned Dagster asset graph.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
