"""Code identity: a versioned asset whose code (the body and every function of ours it reaches)
changed while its code_version did not fails here, naming the asset and the functions.

After a deliberate change: bump the asset's code_version (its artifacts will recompute), then
re-pin with ``python -m tests.support.fingerprint --update`` in the same commit.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from tests.support.fingerprint import PINS, _unwrapped, differences, reachable

ROOT = PINS.parents[1]


@pytest.mark.slow
def test_every_versioned_assets_code_matches_its_pin():
    # In a fresh interpreter, as `--update` pins: which of our modules are imported (and so which
    # subclasses of a resource's base class exist) must not depend on the tests run before.
    check = subprocess.run(
        [sys.executable, "-m", "tests.support.fingerprint"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-2000:]
    assert "every versioned asset's code matches its pin" in check.stdout


def _module(tmp_path, name: str, source: str):
    """A module of ours (its name under marin_assets) loaded from a real file, as a library module is."""
    path = tmp_path / f"{name.rsplit('.', 1)[-1]}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def probe(tmp_path, monkeypatch):
    def load(helper_body: str, docstring: str = "One helper."):
        monkeypatch.delitem(sys.modules, "marin_assets._fp_helper", raising=False)
        helper = _module(
            tmp_path / "h",
            "marin_assets._fp_helper",
            f'''
            def deep(x):
                return x + 1

            def helper(x):
                """{docstring}"""
                {helper_body}
            ''',
        )
        body = _module(
            tmp_path / "b",
            "marin_assets._fp_body",
            """
            from marin_assets import _fp_helper

            def body(ctx, config):
                from marin_assets._fp_helper import helper
                return helper(1)
            """,
        )
        return helper, body.body

    (tmp_path / "h").mkdir()
    (tmp_path / "b").mkdir()
    yield load
    for name in ("marin_assets._fp_helper", "marin_assets._fp_body"):
        sys.modules.pop(name, None)


def test_the_fingerprint_follows_imports_transitively_and_ignores_docstrings(probe):
    _, body = probe("return deep(x)")
    first = reachable(body)
    assert set(first) == {"<body>", "marin_assets._fp_helper.helper", "marin_assets._fp_helper.deep"}
    _, body = probe("return deep(x)", docstring="Reworded, and a comment: no behaviour changed.")
    assert reachable(body) == first
    _, body = probe("return deep(x) * 2")
    changed = reachable(body)
    assert [n for n in first if first[n] != changed.get(n)] == ["marin_assets._fp_helper.helper"]


def test_a_change_under_the_same_code_version_names_the_asset_and_the_function():
    pinned = {"shards/x": {"code_version": "3", "code": {"<body>": "a", "m.f": "b", "m.g": "c"}}}
    same = {"shards/x": {"code_version": "3", "code": {"<body>": "a", "m.f": "B", "m.g": "c"}}}
    assert differences(pinned, same) == ["shards/x: code changed without a code_version bump (still 3): m.f"]
    bumped = {"shards/x": {"code_version": "4", "code": same["shards/x"]["code"]}}
    assert "re-pin" in differences(pinned, bumped)[0]
    assert differences(pinned, pinned) == []


def test_the_fingerprint_sees_through_a_custom_vjp_and_a_partial(tmp_path):
    """A kernel's forward and backward are reached through its jax.custom_vjp, a function through a
    functools.partial (the blockwise attention kernel was invisible behind its custom_vjp)."""
    module = _module(
        tmp_path,
        "marin_assets._fp_vjp",
        """
        import functools

        import jax

        def forward(x):
            return x * 2

        @jax.custom_vjp
        def kernel(x):
            return forward(x)

        def kernel_fwd(x):
            return kernel(x), None

        def kernel_bwd(_, g):
            return (g * 2,)

        kernel.defvjp(kernel_fwd, kernel_bwd)
        doubled = functools.partial(forward)

        def body(ctx, config):
            return kernel(1.0) + doubled(1.0)
        """,
    )
    try:
        names = set(reachable(module.body))
    finally:
        sys.modules.pop("marin_assets._fp_vjp", None)
    assert {f"marin_assets._fp_vjp.{n}" for n in ("kernel", "forward", "kernel_fwd", "kernel_bwd")} <= names


def test_unwrapping_ends_on_a_wrapper_that_wraps_itself():
    class Loop:
        def __call__(self) -> None: ...

        @property
        def fun(self):
            return self

    class Fresh:
        def __call__(self) -> None: ...

        def __getattr__(self, name):
            return Fresh()  # a new wrapper on every read

    loop = Loop()
    assert _unwrapped(loop) == [loop]
    assert 1 < len(_unwrapped(Fresh())) < 10_000
