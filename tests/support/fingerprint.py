"""A fingerprint of the code a versioned asset runs, so a changed implementation without a
``code_version`` bump cannot go unnoticed (tests/test_code_versions.py).

Marin's executor hashes the implementation into the version; we keep Dagster's explicit
``code_version`` (a rename or a refactor should not recompute a corpus) and pin, per asset,
the hash of every function and class its body reaches within ``marin_assets/`` and
``kernels/``, transitively: globals it names, names it imports inside its body, attributes
of our modules it reads, functions in its closure, the methods of the classes it uses, and
what a wrapper it names calls (a ``jax.custom_vjp``'s forward and backward, a partial's function).
A hash is over the source's syntax tree without docstrings, so comments, docstrings and
formatting do not count; anything else does.

    python -m tests.support.fingerprint          # print what changed against the pins
    python -m tests.support.fingerprint --update # re-pin after bumping the code_versions
"""

from __future__ import annotations

import ast
import dis
import hashlib
import importlib
import inspect
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

OURS = ("marin_assets", "kernels")
PINS = Path(__file__).resolve().parents[1] / "code_fingerprints.json"


def _is_ours(obj: Any) -> bool:
    """A function or class of ours with a source file (not one made at run time: a dataclass's
    generated __repr__ is its class's syntax, already hashed)."""
    module = getattr(obj, "__module__", None) or ""
    if module.split(".")[0] not in OURS or not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return False
    try:
        return inspect.getsourcefile(obj) is not None and not (
            inspect.isfunction(obj) and obj.__code__.co_filename.startswith("<")
        )
    except TypeError:
        return False


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _referenced(fn: types.FunctionType) -> list[Any]:
    """Our functions and classes that ``fn``'s code names, imports, reads off our modules or closes over."""
    found: list[Any] = []
    names: set[str] = set()
    for code in _code_objects(fn.__code__):
        names.update(code.co_names)
        module = None
        for ins in dis.get_instructions(code):
            if ins.opname == "IMPORT_NAME":
                try:
                    module = importlib.import_module(ins.argval)
                except ImportError:
                    module = None
            elif ins.opname == "IMPORT_FROM" and module is not None:
                found.append(getattr(module, ins.argval, None))
    modules = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v.__name__.split(".")[0] in OURS]
    for name in names:
        found.append(fn.__globals__.get(name))
        found.extend(getattr(m, name, None) for m in modules)
    found.extend(cell.cell_contents for cell in fn.__closure__ or () if _cell_set(cell))
    return [inner for obj in found for inner in _unwrapped(obj) if _is_ours(inner)]


# What a wrapper calls: jax.custom_vjp (fun, fwd, bwd), jax.custom_jvp (fun, jvp), functools.partial
# (func), and a decorator that keeps __wrapped__ (functools.wraps, jax.jit).
_WRAPPED = ("fun", "fwd", "bwd", "jvp", "func", "__wrapped__")


def _unwrapped(obj: Any, depth: int = 4) -> list[Any]:
    """``obj`` and, when it wraps functions (a kernel's ``jax.custom_vjp``: its forward and backward are
    the code that runs), what it wraps, unwrapped in turn (``depth`` levels: a wrapper that wraps itself,
    or makes a new object on every attribute read, ends there)."""
    if depth == 0 or obj is None or inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj):
        return [obj]
    inner = []
    for name in _WRAPPED:
        try:
            inner.append(getattr(obj, name, None))
        except Exception:  # noqa: BLE001 - a property that fails on this object wraps nothing
            continue
    return [obj, *(found for x in inner if callable(x) and x is not obj for found in _unwrapped(x, depth - 1))]


def _cell_set(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _syntax_hash(obj: Any) -> str:
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):  # made at run time (a pydantic create_model config): its maker is hashed
        return "generated"
    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def _resource_classes(root: types.FunctionType) -> list[type]:
    """Our classes the body's parameters are annotated with, and their subclasses: a resource
    (the training backend) is called through its base class, and any implementation may run."""
    import typing

    try:
        hints = typing.get_type_hints(root)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve here adds nothing
        return []
    found = []
    for hint in hints.values():
        if inspect.isclass(hint) and _is_ours(hint):
            found += [hint, *_subclasses(hint)]
    return found


def _subclasses(cls: type) -> list[type]:
    """Our subclasses of ``cls`` (a test's stand-in backend is not code an asset ships)."""
    every = [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]
    return [sub for sub in every if _is_ours(sub)]


class Memo:
    """Each object's syntax hash and references, worked out once for all the assets of one run: the
    assets share most of what they reach (45 assets reached 827 distinct objects 4207 times). An
    entry keeps its object, so no id is reused while the memo lives."""

    def __init__(self) -> None:
        self._hashes: dict[int, tuple[Any, str]] = {}
        self._refs: dict[int, tuple[Any, list[Any]]] = {}

    def syntax_hash(self, obj: Any) -> str:
        if id(obj) not in self._hashes:
            self._hashes[id(obj)] = (obj, _syntax_hash(obj))
        return self._hashes[id(obj)][1]

    def referenced(self, fn: types.FunctionType) -> list[Any]:
        if id(fn) not in self._refs:
            self._refs[id(fn)] = (fn, _referenced(fn))
        return self._refs[id(fn)][1]


def reachable(root: types.FunctionType, memo: Memo | None = None) -> dict[str, str]:
    """{qualified name: syntax hash} of ``root`` (under the name "<body>") and everything it reaches."""
    memo = memo or Memo()
    out = {"<body>": memo.syntax_hash(root)}
    todo, seen = [*memo.referenced(root), *_resource_classes(root)], {id(root)}
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        out[f"{obj.__module__}.{obj.__qualname__}"] = memo.syntax_hash(obj)
        members = [obj] if inspect.isfunction(obj) else [m for m in vars(obj).values() if inspect.isfunction(m)]
        for fn in members:
            seen.add(id(fn))
            todo.extend(memo.referenced(fn))
    return dict(sorted(out.items()))


def versioned_bodies() -> dict[str, tuple[str, types.FunctionType]]:
    """{asset key: (code_version, body)} of every versioned asset of the code location."""
    from definitions import defs
    from marin_assets.orchestration.versioned import planner_of

    out = {}
    for asset in defs.assets or []:
        planner = planner_of(asset) if hasattr(asset, "op") else None
        if planner is not None:
            out[asset.key.to_user_string()] = (planner.stage.code_version, planner.stage.body)
    return dict(sorted(out.items()))


def current() -> dict[str, dict]:
    memo = Memo()
    return {key: {"code_version": version, "code": reachable(body, memo)} for key, (version, body) in versioned_bodies().items()}


def differences(pinned: dict[str, dict], now: dict[str, dict]) -> list[str]:
    """One line per asset whose code changed under the same code_version, or whose pin is stale."""
    lines = []
    for key, entry in now.items():
        old = pinned.get(key)
        if old is None:
            lines.append(f"{key}: not pinned (run python -m tests.support.fingerprint --update)")
        elif old["code_version"] != entry["code_version"]:
            lines.append(
                f"{key}: code_version {old['code_version']} -> {entry['code_version']}: re-pin "
                f"(python -m tests.support.fingerprint --update)"
            )
        else:
            changed = sorted(n for n in set(old["code"]) | set(entry["code"]) if old["code"].get(n) != entry["code"].get(n))
            if changed:
                lines.append(
                    f"{key}: code changed without a code_version bump (still {entry['code_version']}): "
                    f"{', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}"
                )
    lines += [f"{key}: pinned but no longer a versioned asset (re-pin)" for key in sorted(set(pinned) - set(now))]
    return lines


def main(argv: list[str]) -> int:
    now = current()
    if "--update" in argv:
        PINS.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"pinned {len(now)} assets in {PINS}")
        return 0
    lines = differences(json.loads(PINS.read_text()) if PINS.exists() else {}, now)
    print("\n".join(lines) or "every versioned asset's code matches its pin")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
