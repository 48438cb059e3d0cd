"""Issue 14: --help reads as an operator expects: flags without a type, every command listed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corectl.cli import app

COMMANDS = ["init", "validate", "provision", "health", "status", "runs", "history", "rma", "add-node", "drain"]


@pytest.mark.parametrize("argv", [[], *([c] for c in COMMANDS)], ids=["corectl", *COMMANDS])
def test_help_shows_no_type_beside_a_flag(argv: list[str]):
    result = CliRunner().invoke(app, [*argv, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_every_command_is_listed():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    for command in COMMANDS:
        assert f" {command} " in result.output, command
