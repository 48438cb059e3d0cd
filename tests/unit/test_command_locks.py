"""Issue 46: every command declares what it does to its site (corectl.cli.policy.COMMAND_LOCKS); every
command declared as changing holds the site's lock: run while another command holds it, each is refused with
exit 75 and the holder named, before it reads a password, contacts a node or writes a file of the site; and
every command declared as reading leaves the site byte-identical."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corectl import lock
from corectl.cli import app
from corectl.cli.policy import CHANGES, COMMAND_LOCKS, READS
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
    "upgrade os": (["upgrade", "os"], ""),
    "upgrade slurm": (["upgrade", "slurm"], ""),
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


# each read-only command as an operator types it (the site added by the test)
READ_ARGV: dict[str, list[str]] = {
    "backup --list": ["backup", "--list"],
    "history": ["history", "dgx01"],
    "logs": ["logs", "dgx01"],
    "power status": ["power", "status", "dgx01"],
    "render --check": ["render", "--check"],
    "report": ["report"],
    "rma": ["rma"],
    "runs": ["runs"],
    "schema": ["schema"],
    "secrets backup-key": ["secrets", "backup-key"],
    "secrets check": ["secrets", "check"],
    "status": ["status"],
    "validate": ["validate"],
}


class FakeRunner:
    """ansible_runner.run as far as the site can tell: it writes its artifacts where it is told (a recorded run's
    go to the site's .runs/) and, as Ansible does for a run that gathers no fact, the Python it discovered on the
    controller into the fact cache it is given; the run fails, as against a controller that cannot be reached.
    No traffic."""

    def __init__(self) -> None:
        self.playbooks: list[str] = []

    def __call__(self, **kwargs: object) -> object:
        self.playbooks.append(Path(str(kwargs["playbook"])).name)
        artifacts = Path(str(kwargs["artifact_dir"])) / str(kwargs["ident"])
        (artifacts / "job_events").mkdir(parents=True)
        (artifacts / "status").write_text("failed")
        facts = Path(str(kwargs["fact_cache"]))
        facts.mkdir(parents=True, exist_ok=True)
        (facts / "head01").write_text('{"discovered_interpreter_python": "/usr/bin/python3"}')
        return type("Result", (), {"status": "failed", "rc": 2})()


class FakeBmc:
    def state(self) -> str:
        return "on"


def lived_site(directory: Path) -> None:
    """What a site that has run holds: its inventory, host keys, its store (a verdict, a run in the index), a
    run's folder."""
    from corectl import store
    from corectl.health import failures
    from corectl.site import render
    from corectl.site.loader import load_cluster

    render.write(load_cluster(directory), directory)
    site = Site(root=directory.parents[1], directory=directory)
    report = {"node": "dgx01", "ok": False, "checks": [{"name": "xid", "status": "fail", "message": "Xid 79"}]}
    failures.record_verdicts(site, {"dgx01": report}, datetime.now(UTC), "20261201T000000-1")
    (directory / "known_hosts").write_text("10.10.1.11 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDk0\n")
    (directory / ".facts").mkdir()
    (directory / ".facts" / "head01").write_text('{"discovered_interpreter_python": "/usr/bin/python3.11"}')
    run = directory / ".runs" / "20261201T000000-1"
    run.mkdir(parents=True)
    record = {"command": "health", "status": "successful", "hosts": {}, "started": "2026-12-01T00:00:00+00:00"}
    (run / "corectl.json").write_text(json.dumps(record))
    store.add_run(site, run.name, record)


def test_every_read_only_command_is_listed():
    assert set(READ_ARGV) == {entry for entry, kind in COMMAND_LOCKS.items() if kind == READS}


@pytest.mark.parametrize("entry", sorted(READ_ARGV))
def test_a_read_only_command_writes_nothing_to_its_site(entry: str, prod_copy: Path, monkeypatch: pytest.MonkeyPatch):
    """Issue 46: run against a site that has run, each read leaves it byte-identical (no file added beside the
    history either), whether its runs on the nodes succeed or not; none ends in a traceback."""
    import ansible_runner

    from corectl import bmc

    lived_site(prod_copy)
    runner = FakeRunner()
    monkeypatch.setattr(ansible_runner, "run", runner)
    monkeypatch.setattr(bmc, "client", lambda *_args, **_kw: FakeBmc())
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD", "")
    before = snapshot(prod_copy)
    result = CliRunner().invoke(app, [*READ_ARGV[entry], "--inventory", str(prod_copy)])
    said = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exception is None or isinstance(result.exception, SystemExit), (entry, said)
    assert "Traceback" not in said, (entry, said)
    assert snapshot(prod_copy) == before, (entry, runner.playbooks, said)
