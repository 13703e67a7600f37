"""The ``marin`` command line.

Every module in this package that defines ``register(subparsers)`` adds one subcommand,
so each area (datakit, train, scaling, cluster, demo) owns its own file and the
dispatcher never changes when a new one arrives.

``marin`` alone, or a group that has subcommands (``marin datakit``) without one, is a
usage error: usage on stderr, exit 2 (it did nothing, and a script must not take it for
done). Groups in ``RUNS_WITHOUT_SUBCOMMAND`` are the exception: there the group itself is a
command and its subcommands are optional tools (``marin train`` is a training run).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

RUNS_WITHOUT_SUBCOMMAND = frozenset({"train"})


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: with a command named first, only that command's module is
    imported (each pulls in its own stack, Dagster or JAX: `marin generate` need not load
    DataKit); otherwise (``--help``, no command, an unknown one) every command's."""
    parser = argparse.ArgumentParser(
        prog="marin",
        description="Reproducible LM training as a content-versioned Dagster asset graph.",
    )
    parser.set_defaults(handler=_usage_error(parser, "a command is required"))
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_modules(argv):
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    for name, group in subcommands(parser).items():
        if name not in RUNS_WITHOUT_SUBCOMMAND and subcommands(group):
            # The group's own default (its help on stdout, exit 0) would pass for success.
            wanted = ", ".join(subcommands(group))
            group.set_defaults(handler=_usage_error(group, f"a subcommand is required (one of: {wanted})"))
    return parser


def _command_modules(argv: list[str] | None) -> list[str]:
    """The modules to register for ``argv``: the named command's alone, when there is one (each
    module registers the command of its own name), else all of them."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    first = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    return [first] if first in names else names


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """{name: parser} of the (sub)commands `parser` dispatches to; {} for a leaf command."""
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def _usage_error(parser: argparse.ArgumentParser, message: str):
    """A handler that prints the parser's usage and `message` on stderr and exits 2 (as argparse's own errors)."""

    def handler(args: argparse.Namespace) -> int:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2

    return handler


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
