"""Suite-wide rules.

Under CI (``CI=true``, as `.ci/run` runs) a skipped test is a failed test: a missing
PostgreSQL, Chromium or anchor file must turn CI red, not quietly shrink what it checked.
Locally a skip stays a skip, with its reason (``make test`` prints them with ``-rs``).
Every test session writes artifacts and telemetry under a temporary MARIN_PREFIX, and no test
records in the checkout's DAGSTER_HOME.
"""

from __future__ import annotations

import os

import pytest


def _share_one_jax_compile_cache() -> None:
    """Every test process (pytest's workers and the CLIs they start, which inherit the environment)
    uses one persistent XLA compile cache, kept between sessions: most of a test's time on CPU is
    compiling tiny models (measured: tests/model 219 s cold, 70 s warm). JAX reads these variables
    when it is imported, which no test module has done yet. No size cap: a cap turns on JAX's
    eviction, which fails every write into a cache that the CLI and the demo (uncapped) filled, as
    their entries have no access-time files; an entry read while another process writes it is a
    warning and a recompile in JAX, not a wrong result."""
    from marin_assets.train.compile_cache import CACHE_ENV, default_cache_dir

    os.environ.setdefault(CACHE_ENV, default_cache_dir())
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


_share_one_jax_compile_cache()


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run every test: {reason}"


@pytest.fixture(scope="session", autouse=True)
def _artifacts_in_a_temporary_prefix(tmp_path_factory):
    """Tests never write into the checkout's ./artifacts and ./.dagster_home (where `make test`
    points MARIN_PREFIX and DAGSTER_HOME): code that defaults to $MARIN_PREFIX (the store,
    telemetry) lands in a per-session temporary prefix, and code that records in $DAGSTER_HOME's
    instance when it is set (`marin datakit run`) uses an ephemeral one. Tests that need either
    set it themselves."""
    before = {name: os.environ.get(name) for name in ("MARIN_PREFIX", "DAGSTER_HOME")}
    os.environ["MARIN_PREFIX"] = str(tmp_path_factory.mktemp("marin_prefix"))
    os.environ.pop("DAGSTER_HOME", None)
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


FRESH_PROCESS_ENV = "MARIN_TEST_IN_FRESH_PROCESS"
OUTCOMES_ENV = "MARIN_TEST_OUTCOMES"  # where a fresh interpreter writes {nodeid: [outcome, text]}
_FRESH_OUTCOMES = pytest.StashKey[dict]()  # this session's outcomes from fresh interpreters, by nodeid


def _forks_nodeids_of_file(item) -> list[str]:
    """``item`` and the ``forks`` tests after it in its file, as selected in this session (all on this
    worker: make test hands out whole files)."""
    path = item.nodeid.split("::")[0]
    rest = item.session.items[item.session.items.index(item) :]
    return [i.nodeid for i in rest if i.nodeid.split("::")[0] == path and i.get_closest_marker("forks") is not None]


def _run_in_a_fresh_interpreter(item) -> dict[str, list[str]]:
    """Run the ``forks`` tests of ``item``'s file in one fresh interpreter (one Dagster and JAX
    import for the file, not one per test); returns {nodeid: [outcome, text]}."""
    import json
    import subprocess
    import sys
    import tempfile

    nodeids = _forks_nodeids_of_file(item)
    with tempfile.TemporaryDirectory() as tmp:
        outcomes_file = os.path.join(tmp, "outcomes.json")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", *nodeids],
            cwd=item.config.rootpath,
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, FRESH_PROCESS_ENV: "1", OUTCOMES_ENV: outcomes_file},
        )
        outcomes = json.loads(open(outcomes_file).read()) if os.path.exists(outcomes_file) else {}
    # A test the fresh run never reported (it crashed first) fails with the run's output.
    lost = ["failed", f"no outcome (exit {result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"]
    return {n: outcomes.get(n, lost) for n in nodeids}


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked ``forks`` needs range runs to really fork their workers. fan_out refuses
    to fork a process that has loaded tensorstore (the child would abort), which any earlier
    test that tokenized in the same pytest worker does; then, at its file's first such test,
    the file's ``forks`` tests run together in one fresh interpreter, and each one's outcome
    there is its outcome here."""
    if pyfuncitem.get_closest_marker("forks") is None:
        return None
    from marin_assets.orchestration.fanout import fork_unsafe_state

    unsafe = fork_unsafe_state()
    if unsafe is None:
        return None
    if os.environ.get(FRESH_PROCESS_ENV) == "1":
        pytest.fail(
            f"a fresh interpreter already has {unsafe}: an import at collection time, or an earlier test of this file, loads it"
        )
    outcomes = pyfuncitem.config.stash.setdefault(_FRESH_OUTCOMES, {})
    if pyfuncitem.nodeid not in outcomes:
        outcomes.update(_run_in_a_fresh_interpreter(pyfuncitem))
    outcome, text = outcomes[pyfuncitem.nodeid]
    if outcome == "skipped":
        pytest.skip(text)
    if outcome != "passed":
        pytest.fail(f"in a fresh interpreter (this one has {unsafe}):\n{text}")
    return True


def pytest_runtest_logreport(report):
    """In a fresh interpreter started for ``forks`` tests: each test's outcome, for the parent
    (a failure in any phase wins; a pass is the call's)."""
    path = os.environ.get(OUTCOMES_ENV)
    if not path or os.environ.get(FRESH_PROCESS_ENV) != "1":
        return
    import json

    outcomes = json.loads(open(path).read()) if os.path.exists(path) else {}
    if report.failed:
        outcomes[report.nodeid] = ["failed", f"{report.when}: {report.longreprtext[-6000:]}"]
    elif report.skipped:
        outcomes.setdefault(
            report.nodeid, ["skipped", str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else report.longreprtext]
        )
    elif report.when == "call":
        outcomes.setdefault(report.nodeid, ["passed", ""])
    with open(path, "w") as f:
        json.dump(outcomes, f)


# The longest file first: its fixture trains the mesh runs that test_fsdp.py reads too (tests/train/conftest.py
# ``mesh_runs``, behind a file lock); test_fsdp.py goes last, once they exist, so no worker waits on the lock.
FIRST_FILES = ("tests/train/test_mesh.py",)
LAST_FILES = ("tests/train/test_fsdp.py",)


def pytest_collection_modifyitems(config, items):
    """Files with slow tests first, the rest after (a stable sort: the order within a file is kept). `make test`
    hands xdist whole files in this order (``--dist loadfile --no-loadscope-reorder``): its default puts the files
    with the most tests first, which are the quick parametrised ones, leaving the few long end-to-end files for
    last and one worker idle while the other finishes them."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        if path in FIRST_FILES:
            return 0
        if path in LAST_FILES:
            return 3
        return 1 if path in slow else 2

    items.sort(key=rank)
