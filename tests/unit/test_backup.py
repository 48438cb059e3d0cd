"""Backups of the head node (issue 34): role backup's corectl-backup run here against a stand-in mysqldump (a
script on PATH printing what the real one prints first), and what `corectl backup` adds from the control host.
The lab's end-to-end test takes real backups of MariaDB and slurmctld's state."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

PROGRAM = ROOT / "roles" / "backup" / "files" / "corectl-backup"
DUMP = "-- MariaDB dump 10.19  Distrib 10.11.6-MariaDB, for debian-linux-gnu (x86_64)\n--\n-- Host: localhost\n"


@pytest.fixture
def head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A head: a mysqldump on PATH, slurmctld's state directory, the program's settings."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "mysqldump").write_text(f"#!/bin/sh\necho \"$*\" > {tmp_path}/dump-args\nprintf '%s' '{DUMP}'\n")
    (tools / "mysqldump").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    state = tmp_path / "slurmctld"
    state.mkdir()
    (state / "job_state").write_bytes(b"\x00\x01job state")
    (state / "assoc_usage").write_bytes(b"\x00\x02usage")
    settings = {"destination": str(tmp_path / "backups"), "retention": 2, "database": "slurm_acct_db",
                "state_dir": str(state)}  # fmt: skip
    (tmp_path / "backup.json").write_text(json.dumps(settings))
    return tmp_path


def program(head: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(PROGRAM), "--config", str(head / "backup.json"), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ.copy(), timeout=60)


def test_a_backup_holds_the_database_dump_and_the_saved_state_with_their_checksums(head: Path):
    extra = head / "corectl-site.tar.gz"
    extra.write_bytes(b"site archive")
    taken = program(head, "take", "--add", str(extra), "--json")
    assert taken.returncode == 0, taken.stderr
    [row] = json.loads(taken.stdout)
    assert row["files"] == ["corectl-site.tar.gz", "slurm_acct_db.sql.gz", "slurmctld-state.tar.gz"]
    assert row["verified"] == "ok"
    backup = Path(row["path"])
    assert backup.parent == head / "backups" and not list((head / "backups").glob(".*"))
    # one transaction of the accounting database, and the state directory as it was
    assert (head / "dump-args").read_text().split() == [
        "--single-transaction", "--routines", "--triggers", "--databases", "slurm_acct_db",
    ]  # fmt: skip
    import gzip

    assert gzip.decompress((backup / "slurm_acct_db.sql.gz").read_bytes()).decode() == DUMP
    with tarfile.open(backup / "slurmctld-state.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["slurmctld", "slurmctld/assoc_usage", "slurmctld/job_state"]
    manifest = json.loads((backup / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"corectl-site.tar.gz", "slurm_acct_db.sql.gz", "slurmctld-state.tar.gz"}
    assert program(head, "verify", backup.name).returncode == 0


def test_a_changed_or_missing_file_fails_verification(head: Path):
    [row] = json.loads(program(head, "take", "--json").stdout)
    backup = Path(row["path"])
    with open(backup / "slurm_acct_db.sql.gz", "r+b") as handle:
        handle.seek(5)
        handle.write(b"X")
    verified = program(head, "verify", backup.name)
    assert (verified.returncode, verified.stdout.strip()) == (
        1,
        f"{backup.name}: corrupt: slurm_acct_db.sql.gz does not match its checksum",
    )
    (backup / "slurmctld-state.tar.gz").unlink()
    [listed] = json.loads(program(head, "list", "--json").stdout)
    assert listed["verified"] == "corrupt: slurm_acct_db.sql.gz does not match its checksum"
    (backup / "MANIFEST.json").unlink()
    [listed] = json.loads(program(head, "list", "--json").stdout)
    assert listed["verified"] == "incomplete: no readable manifest"


def test_the_newest_backups_up_to_the_retention_count_are_kept(head: Path):
    names = [json.loads(program(head, "take", "--json").stdout)[0]["name"] for _ in range(3)]
    listed = [row["name"] for row in json.loads(program(head, "list", "--json").stdout)]
    assert listed == names[1:]  # retention 2: the first is gone
    assert len(set(names)) == 3  # taken within one second: each its own name


def test_a_failed_dump_leaves_no_backup_behind(head: Path):
    (head / "bin" / "mysqldump").write_text("#!/bin/sh\necho 'mysqldump: Got error: 2002' >&2\nexit 2\n")
    failed = program(head, "take", "--json")
    assert failed.returncode == 1
    assert failed.stderr.strip() == "corectl-backup: mysqldump failed (rc 2): mysqldump: Got error: 2002"
    assert list((head / "backups").iterdir()) == []


def test_settings_without_a_destination_are_refused(head: Path):
    (head / "backup.json").write_text(json.dumps({"retention": 2}))
    refused = program(head, "list")
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        f"corectl-backup: {head}/backup.json: destination missing",
    )


def test_the_site_archive_keeps_secrets_encrypted_and_leaves_the_vault_password_out(tmp_path: Path):
    from corectl.commands.backup import site_archive
    from corectl.site import Site

    site = Site(root=tmp_path, directory=tmp_path / "inventories" / "lab")
    (site.directory / "secrets").mkdir(parents=True)
    (site.directory / "secrets" / "secrets.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162\n")
    (site.directory / ".vault-pass").write_text("the password\n")
    (site.directory / ".lab").mkdir()
    (site.directory / "cluster.yml").write_text("cluster: {}\n")
    (site.runs_dir / "20261126T100000Z").mkdir(parents=True)
    (site.runs_dir / "20261126T100000Z" / "corectl.json").write_text("{}")
    with sqlite3.connect(site.history_db) as db:
        db.execute("CREATE TABLE verdicts (node TEXT)")
        db.execute("INSERT INTO verdicts VALUES ('dgx01')")
    out = tmp_path / "out"
    out.mkdir()
    archive = site_archive(site, out)
    assert oct(archive.stat().st_mode & 0o777) == "0o600"
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
        assert names == [
            "lab/.history.sqlite",
            "lab/.runs",
            "lab/.runs/20261126T100000Z",
            "lab/.runs/20261126T100000Z/corectl.json",
            "lab/cluster.yml",
            "lab/secrets",
            "lab/secrets/secrets.yml",
        ]
        assert tar.extractfile("lab/secrets/secrets.yml").read().startswith(b"$ANSIBLE_VAULT")  # type: ignore[union-attr]
        tar.extract("lab/.history.sqlite", tmp_path / "restored", filter="data")
    with sqlite3.connect(tmp_path / "restored" / "lab" / ".history.sqlite") as db:
        assert db.execute("SELECT node FROM verdicts").fetchall() == [("dgx01",)]


def test_the_program_loads_as_a_module():
    """It is standard-library Python the head runs with its own python3: no import of corectl."""
    loader = importlib.machinery.SourceFileLoader("corectl_backup", str(PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    assert "corectl" not in {name.split(".")[0] for name in sys.modules if name.startswith("corectl_backup")}
    assert module.FORMAT == 1
