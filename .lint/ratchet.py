"""Static-check ratchet: ruff (lint and format) and basedpyright may only get better than the recorded baseline.

    python .lint/ratchet.py              check; exit 1 and list every finding that is not in the baseline
    python .lint/ratchet.py --update     drop what was fixed from the baselines (refused while anything is new)
    python .lint/ratchet.py --record     record today's findings as the baseline (accepts them all: review the diff)
    python .lint/ratchet.py --only ruff  (or pyright) one tool only

Baselines: ``.lint/ruff-baseline.json`` holds, per file, the count of each ruff rule and the files ``ruff format``
would change; a count above the recorded one, or a file newly needing formatting, is new. basedpyright keeps its
own baseline (``baselineFile`` in pyproject.toml), matched by file, rule and position within the line, so edits
elsewhere in a file do not resurface old errors. The checked folders are ``[tool.basedpyright] include``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF_BASELINE = ROOT / ".lint" / "ruff-baseline.json"
BIN = Path(sys.executable).parent  # ruff and basedpyright come with the dev extra, in the same venv

LintCounts = dict[str, dict[str, int]]  # file -> rule -> count


def checked_paths(root: Path = ROOT) -> list[str]:
    """The folders and files both tools check: ``[tool.basedpyright] include`` of pyproject.toml."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return list(config["tool"]["basedpyright"]["include"])


def _run(argv: list[str], cwd: Path, ok_codes: tuple[int, ...]) -> subprocess.CompletedProcess:
    if not Path(argv[0]).exists():
        raise RuntimeError(f"{argv[0]} is not installed: the dev extra provides it (`make venv`)")
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode not in ok_codes:
        raise RuntimeError(f"{' '.join(argv[:3])} failed with exit code {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def ruff_lint(root: Path, paths: list[str], config: Path = ROOT / "pyproject.toml") -> tuple[LintCounts, list[dict]]:
    """(per-file rule counts, the raw findings) of ``ruff check`` over ``paths`` relative to ``root``."""
    argv = [str(BIN / "ruff"), "check", "--no-cache", "--exit-zero", "--output-format", "json", "--config", str(config), *paths]
    findings = json.loads(_run(argv, root, (0,)).stdout)
    counts: LintCounts = {}
    for finding in findings:
        finding["filename"] = Path(finding["filename"]).resolve().relative_to(root.resolve()).as_posix()
        rule = finding.get("code") or "syntax-error"
        per_file = counts.setdefault(finding["filename"], {})
        per_file[rule] = per_file.get(rule, 0) + 1
    return counts, findings


def ruff_unformatted(root: Path, paths: list[str], config: Path = ROOT / "pyproject.toml") -> set[str]:
    """Files (relative to ``root``) that ``ruff format`` would change."""
    argv = [str(BIN / "ruff"), "format", "--no-cache", "--check", "--output-format", "json", "--config", str(config), *paths]
    report = json.loads(_run(argv, root, (0, 1)).stdout or "[]")
    return {Path(f["filename"]).resolve().relative_to(root.resolve()).as_posix() for f in report}


def new_lint(baseline: LintCounts, current: LintCounts) -> dict[tuple[str, str], tuple[int, int]]:
    """(file, rule) -> (recorded, now) where there are more findings now than recorded."""
    return {
        (file, rule): (baseline.get(file, {}).get(rule, 0), n)
        for file, rules in current.items()
        for rule, n in rules.items()
        if n > baseline.get(file, {}).get(rule, 0)
    }


def fixed_count(baseline: LintCounts, current: LintCounts, paths: list[str]) -> int:
    """How many recorded findings in files under ``paths`` are gone."""
    return sum(
        max(0, n - current.get(file, {}).get(rule, 0))
        for file, rules in baseline.items()
        if _under(file, paths)
        for rule, n in rules.items()
    )


def _under(file: str, paths: list[str]) -> bool:
    return any(file == p.rstrip("/") or file.startswith(p.rstrip("/") + "/") for p in paths)


def pyright(project: Path = ROOT, mode: str = "discard") -> tuple[list[dict], str]:
    """(errors and warnings that are not in the baseline, basedpyright's note about its baseline file).

    ``mode``: ``discard`` leaves the baseline file alone, ``auto`` drops fixed errors from it (only when
    nothing is new), ``record`` rewrites it with every current error."""
    flag = "--writebaseline" if mode == "record" else f"--baselinemode={mode}"
    done = _run([str(BIN / "basedpyright"), "--outputjson", flag, "-p", str(project / "pyproject.toml")], project, (0, 1))
    start = done.stdout.index("{")  # a line about the baseline file may come before the report
    report = json.loads(done.stdout[start:])
    return [d for d in report["generalDiagnostics"] if d["severity"] in ("error", "warning")], done.stdout[:start].strip()


def _describe_pyright(diagnostic: dict, root: Path) -> str:
    where = Path(diagnostic["file"]).resolve().relative_to(root.resolve()).as_posix()
    line = diagnostic.get("range", {}).get("start", {}).get("line", -1) + 1
    message = diagnostic["message"].splitlines()[0]
    return f"basedpyright {diagnostic.get('rule', diagnostic['severity'])} in {where}:{line}: {message}"


def check_ruff(
    root: Path = ROOT,
    paths: list[str] | None = None,
    baseline_file: Path = RUFF_BASELINE,
    update: bool = False,
    record: bool = False,
) -> list[str]:
    """One entry per new ruff finding (per file and rule; empty: none); rewrite the baseline when asked and allowed."""
    paths = paths or checked_paths(root)
    counts, findings = ruff_lint(root, paths)
    unformatted = ruff_unformatted(root, paths)
    baseline = json.loads(baseline_file.read_text()) if baseline_file.exists() and not record else {"check": {}, "format": []}
    problems = []
    for (file, rule), (recorded, now) in sorted(new_lint(baseline["check"], counts).items()):
        lines = [
            f"    {f['filename']}:{f['location']['row']}: {f['message']}"
            for f in findings
            if f["filename"] == file and (f.get("code") or "syntax-error") == rule
        ]
        problems.append("\n".join([f"ruff {rule} in {file}: {now} now, {recorded} recorded", *lines]))
    newly_unformatted = sorted(unformatted - set(baseline["format"]))
    problems += [f"ruff format: {file} would be reformatted (`ruff format {file}`)" for file in newly_unformatted]
    fixed = fixed_count(baseline["check"], counts, paths) + len({f for f in baseline["format"] if _under(f, paths)} - unformatted)
    if record or (update and not problems):
        baseline_file.write_text(json.dumps({"check": counts, "format": sorted(unformatted)}, indent=1, sort_keys=True) + "\n")
        total = sum(sum(rules.values()) for rules in counts.values())
        print(f"ruff: baseline written ({total} findings, {len(unformatted)} files unformatted)")
        return []
    if fixed:
        print(f"ruff: {fixed} recorded findings are gone; `python .lint/ratchet.py --update` drops them from the baseline")
    return problems


def check_pyright(root: Path = ROOT, update: bool = False, record: bool = False) -> list[str]:
    """One entry per new basedpyright finding (empty: none); rewrite its baseline when asked and allowed."""
    new, note = pyright(root, "record" if record else "auto" if update else "discard")
    if "outdated" in note:  # basedpyright's own advice names its flag, not this script
        note = f"recorded errors are fixed ({note.rsplit('(', 1)[-1]}; `python .lint/ratchet.py --update` drops them"
    if note:
        print(f"basedpyright: {note}")
    return [] if record else [_describe_pyright(d, root) for d in new]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--update", action="store_true", help="drop fixed findings from the baselines")
    action.add_argument("--record", action="store_true", help="record every current finding as the baseline")
    parser.add_argument("--only", choices=("ruff", "pyright"))
    args = parser.parse_args(argv)
    problems = []
    if args.only in (None, "ruff"):
        problems += check_ruff(update=args.update, record=args.record)
    if args.only in (None, "pyright"):
        problems += check_pyright(update=args.update, record=args.record)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} new static-check findings: fix them (or, deliberately, `python .lint/ratchet.py --record`)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
