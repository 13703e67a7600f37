"""`marin` and `marin <group>` without a (sub)command: usage on stderr and exit 2, never a
silent 0 a script would take for done (issue 35)."""

from __future__ import annotations

import pytest

from marin_assets.cli import RUNS_WITHOUT_SUBCOMMAND, build_parser, main, subcommands

GROUPS = sorted(
    name for name, group in subcommands(build_parser()).items() if subcommands(group) and name not in RUNS_WITHOUT_SUBCOMMAND
)


def test_marin_alone_is_a_usage_error(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: marin") and "marin: error: a command is required" in err


def test_the_groups_with_subcommands_are_the_expected_ones():
    assert {"datakit", "telemetry", "scaling", "cluster", "eval", "experiment", "plan"} <= set(GROUPS)
    assert "train" not in GROUPS and "demo" not in GROUPS  # a training run, a run: commands themselves


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_without_its_subcommand_is_a_usage_error(group, capsys):
    assert main([group]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"usage: marin {group}" in err
    assert f"marin {group}: error: a subcommand is required (one of: " in err


def test_a_subcommand_still_gets_its_own_handler(capsys, tmp_path):
    # The group's default must not shadow its subcommands' handlers.
    assert main(["telemetry", "query", "--root", str(tmp_path / "empty")]) == 1  # no rows matched
    assert "no rows matched" in capsys.readouterr().err


def test_a_named_command_loads_only_its_own_module():
    """`marin <command> ...` imports that command's module alone (build_parser): it must register
    exactly the command of its name, or the lazy parser would miss or mislabel it."""
    every = set(subcommands(build_parser([])))
    assert every >= {"datakit", "train", "generate", "export", "demo"}
    for name in every:
        assert set(subcommands(build_parser([name, "--help"]))) == {name}
    assert set(subcommands(build_parser(["no-such-command"]))) == every  # argparse lists every choice
    assert set(subcommands(build_parser(["--help"]))) == every


def test_an_unknown_command_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no-such-command'" in err and "'datakit'" in err and "'train'" in err
