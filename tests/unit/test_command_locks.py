"""Issue 46: every command declares what it does to its site (corectl.cli.policy.COMMAND_LOCKS), and every
command declared as changing holds the site's lock: run while another command holds it, each is refused with
exit 75 and the holder named, before it reads a password, contacts a node or writes a file of the site."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corectl import lock
from corectl.cli import app
from corectl.cli.policy import CHANGES, COMMAND_LOCKS
from corectl.site import Site

# each changing command as an operator types it (the site added by the test); stdin for those that read it
ARGV: dict[str, tuple[list[str], str]] = {
    "add-node": (["add-node", "dgx13", "--address", "10.10.1.23", "--profile", "dgx-h100", "--leaf", "leaf2"], ""),
    "backup": (["backup"], ""),
    "bootstrap": (["bootstrap", "--password-env", "CORECTL_TEST_PASSWORD", "--yes"], ""),
    "drain": (["drain", "dgx07", "--reason", "DIMM swap"], ""),
    "heal": (["heal"], ""),
    "health --burn-in": (["health", "--burn-in"], ""),
    "lab add": (["lab", "add"], ""),
    "lab down": (["lab", "down"], ""),
    "lab replace": (["lab", "replace", "dgx01"], ""),
    "lab up": (["lab", "up"], ""),
    "power": (["power", "cycle", "dgx07"], ""),
    "provision": (["provision"], ""),
    "remove-node": (["remove-node", "dgx12"], ""),
    "render": (["render"], ""),
    "restore": (["restore"], ""),
    "resume": (["resume", "dgx07"], ""),
    "runners bootstrap": (["runners", "bootstrap"], ""),
    "secrets init": (["secrets", "init"], ""),
    "secrets set-bmc": (["secrets", "set-bmc", "--user", "admin"], "not-a-real-password\n"),
    "secrets set-ceph-key": (["secrets", "set-ceph-key", "corectl"], "AQ" + "B" * 36 + "==\n"),
    "secrets set-webhook": (["secrets", "set-webhook", "oncall"], "https://hooks.example.invalid/x\n"),
    "upgrade drivers": (["upgrade", "drivers"], ""),
    "validate-nodes": (["validate-nodes"], ""),
}


def commands(group: object, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every command of the app, by its path (`lab up`)."""
    found: list[str] = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        if hasattr(command, "commands"):  # a group (typer's own click)
            found += commands(command, (*prefix, name))
        else:
            found.append(" ".join((*prefix, name)))
    return found


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


def test_every_command_declares_what_it_does_to_its_site():
    paths = commands(typer.main.get_command(app))
    # an entry is a command's path, or its path and the option or argument that switches its kind
    of_entry = {entry: [p for p in paths if entry == p or entry.startswith(p + " ")] for entry in COMMAND_LOCKS}
    assert all(len(found) == 1 for found in of_entry.values()), of_entry
    assert {found[0] for found in of_entry.values()} == set(paths)
    assert set(ARGV) == {entry for entry, kind in COMMAND_LOCKS.items() if kind == CHANGES}


@pytest.mark.parametrize("entry", sorted(ARGV))
def test_a_changing_command_is_refused_while_another_holds_the_lock(
    entry: str, prod_copy: Path, root: Path, monkeypatch: pytest.MonkeyPatch
):
    site = Site(root=root, directory=prod_copy)
    monkeypatch.setenv("CORECTL_TEST_PASSWORD", "not-used")
    argv, stdin = ARGV[entry]
    before = snapshot(prod_copy)
    with lock.site_lock(site, "provision --inventory prod", warn=pytest.fail):
        result = CliRunner().invoke(app, [*argv, "--inventory", str(prod_copy)], input=stdin)
    said = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 75, (entry, result.exit_code, said)
    assert "site prod is busy: `corectl provision --inventory prod` by " in said, (entry, said)
    assert snapshot(prod_copy) == before, entry
