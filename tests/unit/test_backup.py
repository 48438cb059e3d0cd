"""Backups of the head node (issue 34): role backup's corectl-backup run here against a stand-in mysqldump (a
script on PATH printing what the real one prints first), and what `corectl backup` adds from the control host.
The lab's end-to-end test takes real backups of MariaDB and slurmctld's state."""

from __future__ import annotations

import ast
import http.server
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, shipped

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


def test_only_corectls_own_backups_count_in_the_destination(head: Path):
    """Issue 48: a disk's lost+found (or any folder an operator puts there) sorts after a time-named backup: it
    must never be listed, taken for the newest, pruned or restored."""
    for foreign in ("lost+found", "old-backups", "zz-manual"):
        (head / "backups" / foreign).mkdir(parents=True)
    names = [json.loads(program(head, "take", "--json").stdout)[0]["name"] for _ in range(3)]
    listed = program(head, "list", "--json")
    assert listed.returncode == 0, listed.stdout  # no foreign folder to fail verification
    assert [row["name"] for row in json.loads(listed.stdout)] == names[1:]  # retention 2 counts backups only
    assert sorted(p.name for p in (head / "backups").iterdir()) == sorted([*names[1:], "lost+found", "old-backups",
                                                                           "zz-manual"])  # fmt: skip
    # what `restore latest` takes is the newest of these names: a backup, not the folder that sorts last
    assert shipped(PROGRAM, "corectl_backup").Local(head / "backups").names()[-1] == names[-1]
    assert program(head, "verify", "lost+found").stdout.strip() == "lost+found: no such backup"


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


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte for sure. Writing a fixed byte at offset 5 (the gzip header's mtime) left
    the file as it was whenever the dump's mtime already held that byte: 1 run in 256 failed."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0xFF]))


def test_a_changed_or_missing_file_fails_verification(head: Path):
    [row] = json.loads(program(head, "take", "--json").stdout)
    backup = Path(row["path"])
    flip_byte(backup / "slurm_acct_db.sql.gz", 5)
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


def test_the_program_is_standard_library_python():
    """The head runs it with its own python3: its modules import the standard library and each other only."""
    assert shipped(PROGRAM, "corectl_backup").FORMAT == 1
    for path in (ROOT / "roles" / "backup" / "files" / "corectl_backup").glob("*.py"):
        tops = {
            node.module.split(".")[0]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        }
        tops |= {
            alias.name.split(".")[0]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        assert tops <= sys.stdlib_module_names | {"__future__"}, (path.name, tops - sys.stdlib_module_names)


FAKE_MYSQL = """#!/usr/bin/env python3
import os, sys
log = os.environ["FAKE_MYSQL_LOG"]
args = sys.argv[1:]
if "-e" in args:
    sql = args[args.index("-e") + 1]
    with open(log, "a") as out:
        out.write(sql + "\\n")
    if sql.startswith("SHOW DATABASES"):
        print("slurm_acct_db" if os.environ.get("FAKE_DB") else "")
    elif sql.startswith("SHOW TABLES"):
        print("lab_job_table")
    elif sql.startswith("SELECT"):
        print(os.environ.get("FAKE_LATEST", "0"))
else:
    with open(log + ".stdin", "wb") as out:
        out.write(sys.stdin.buffer.read())
"""


def restore_tools(head: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mysql answering from the environment, and a systemctl saying the units named in <head>/active run."""
    (head / "bin" / "mysql").write_text(FAKE_MYSQL)
    (head / "bin" / "mysql").chmod(0o755)
    (head / "bin" / "systemctl").write_text(f'#!/bin/sh\ngrep -qx "$3" {head}/active 2>/dev/null\n')
    (head / "bin" / "systemctl").chmod(0o755)
    monkeypatch.setenv("FAKE_MYSQL_LOG", str(head / "mysql.log"))


@pytest.fixture
def restorable(head: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A head with one backup, a mysql answering from the environment, and slurmctld and slurmdbd stopped."""
    restore_tools(head, monkeypatch)
    [row] = json.loads(program(head, "take", "--json").stdout)
    # after the backup: slurmctld's state moves on, and the database gets a job (on a real head)
    (head / "slurmctld" / "job_state").write_bytes(b"newer state")
    return head, row["name"]


def test_a_restore_loads_the_dump_and_puts_the_saved_state_back_where_none_is(restorable: tuple[Path, str]):
    """A replaced head whose state directory was lost with its disk: the provision left it empty (a stray file of
    it is kept aside with it); the backup's saved state takes its place."""
    head, name = restorable
    (head / "slurmctld" / "job_state").unlink()  # the directory as a blank head's provision leaves it
    done = program(head, "restore", name)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["backup"] == name and result["state"] == str(head / "slurmctld")
    log = (head / "mysql.log").read_text().splitlines()
    assert log[-1] == "DROP DATABASE IF EXISTS `slurm_acct_db`"
    assert (head / "mysql.log.stdin").read_text() == DUMP  # the dump, unzipped, into mysql
    assert (head / "slurmctld" / "job_state").read_bytes() == b"\x00\x01job state"  # as it was at the backup
    aside = head / f"slurmctld.before-restore-{name}"
    assert result["kept_aside"] == str(aside) and (aside / "assoc_usage").read_bytes() == b"\x00\x02usage"


def test_a_restore_keeps_a_saved_state_newer_than_the_backup(restorable: tuple[Path, str]):
    """Issue 48: a head whose state lives on shared storage (a backup controller kept control while the head was
    replaced): only the database is restored; the saved state, newer than the backup, stays as it is (its queue
    and the accounting records the backup controller queued for slurmdbd in it)."""
    head, name = restorable
    done = program(head, "restore", name)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state_kept"] == str(head / "slurmctld") and "state" not in result and "kept_aside" not in result
    assert (head / "mysql.log.stdin").read_text() == DUMP
    assert (head / "slurmctld" / "job_state").read_bytes() == b"newer state"
    assert not (head / f"slurmctld.before-restore-{name}").exists()


def test_a_state_directory_that_cannot_be_renamed_is_moved_aside_by_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A directory from the node's image on an overlay (a package's, in a container image; an overlay root) refuses
    rename with EXDEV: what was there is still kept aside whole, and the backup's state takes its place."""
    import errno

    module = shipped(PROGRAM, "corectl_backup")
    state = tmp_path / "slurmctld"
    (state / "hash.1").mkdir(parents=True)
    (state / "job_state").write_bytes(b"older")
    (state / "hash.1" / "job.1").write_bytes(b"script")
    archive = tmp_path / "state.tar.gz"
    source = tmp_path / "from-backup" / "slurmctld"
    source.mkdir(parents=True)
    (source / "job_state").write_bytes(b"backed up")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="slurmctld")
    real_rename = os.rename

    def rename(src: object, dst: object, *args: object, **kwargs: object) -> None:
        if Path(str(src)) == state:  # the image's directory: the overlay refuses
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    aside = module.unpack(archive, "slurmctld", state, "20261128T000000Z")
    assert aside == str(tmp_path / "slurmctld.before-restore-20261128T000000Z")
    assert (Path(aside) / "job_state").read_bytes() == b"older"
    assert (Path(aside) / "hash.1" / "job.1").read_bytes() == b"script"
    assert (state / "job_state").read_bytes() == b"backed up"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_restore_refuses_a_backup_that_does_not_verify_and_changes_nothing(restorable: tuple[Path, str]):
    head, name = restorable
    (head / "backups" / name / "slurmctld-state.tar.gz").write_bytes(b"not what was archived")
    refused = program(head, "restore", name)
    assert (refused.returncode, refused.stderr.strip()) == (
        3,
        f"corectl-backup: backup {name} does not verify (corrupt: slurmctld-state.tar.gz does not match its "
        "checksum): nothing restored",
    )
    assert (head / "slurmctld" / "job_state").read_bytes() == b"newer state"
    assert not (head / "mysql.log").exists()


def test_a_restore_over_newer_jobs_needs_force(restorable: tuple[Path, str], monkeypatch: pytest.MonkeyPatch):
    head, name = restorable
    monkeypatch.setenv("FAKE_DB", "1")
    monkeypatch.setenv("FAKE_LATEST", str(2**31))  # a job submitted in 2038
    refused = program(head, "restore", name, "--check")
    assert refused.returncode == 3
    assert refused.stderr.strip() == (
        f"corectl-backup: the accounting database holds jobs submitted after backup {name} (in lab_job_table, the "
        "newest at 2038-01-19T03:14:08+00:00): a restore would lose them; --force to restore anyway"
    )
    assert "DROP" not in (head / "mysql.log").read_text()
    assert program(head, "restore", name, "--check", "--force").returncode == 0
    monkeypatch.setenv("FAKE_LATEST", "1000")  # jobs older than the backup: nothing to lose
    assert program(head, "restore", name, "--check").returncode == 0


def test_a_restore_waits_for_slurmctld_to_be_stopped(restorable: tuple[Path, str]):
    head, name = restorable
    (head / "active").write_text("slurmctld\n")
    refused = program(head, "restore", name)
    assert (refused.returncode, refused.stderr.strip()) == (3, "corectl-backup: slurmctld running: stop it first")
    assert (head / "slurmctld" / "job_state").read_bytes() == b"newer state"


def test_a_state_archive_reaching_outside_its_directory_is_not_unpacked(restorable: tuple[Path, str]):
    head, name = restorable
    backup = head / "backups" / name
    evil = head / "evil.tar.gz"
    (head / "payload").write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(head / "payload", arcname="slurmctld/../../payload")
    evil.replace(backup / "slurmctld-state.tar.gz")
    manifest = json.loads((backup / "MANIFEST.json").read_text())
    import hashlib

    data = (backup / "slurmctld-state.tar.gz").read_bytes()
    manifest["files"]["slurmctld-state.tar.gz"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (backup / "MANIFEST.json").write_text(json.dumps(manifest))
    refused = program(head, "restore", name)
    assert (refused.returncode, refused.stderr.strip()) == (
        3,
        "corectl-backup: slurmctld-state.tar.gz holds more than slurmctld/: nothing restored",
    )
    assert (head / "slurmctld" / "job_state").read_bytes() == b"newer state" and not (head.parent / "payload").exists()
    assert not (head / "mysql.log").exists()


def test_each_attempt_leaves_its_outcome_for_the_textfile_collector(head: Path):
    """Role monitoring's HeadBackupFailed and HeadBackupTooOld read these; a failure keeps the last success's time."""
    settings = json.loads((head / "backup.json").read_text())
    (head / "textfile").mkdir()
    (head / "backup.json").write_text(json.dumps({**settings, "metrics_dir": str(head / "textfile")}))
    [row] = json.loads(program(head, "take", "--json").stdout)

    def metrics() -> dict[str, float]:
        text = (head / "textfile" / "corectl_backup.prom").read_text()
        assert "# TYPE corectl_backup_last_attempt_ok gauge" in text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}

    good = metrics()
    assert good["corectl_backup_last_attempt_ok"] == 1 and good["corectl_backup_kept"] == 1
    assert good["corectl_backup_last_size_bytes"] == row["size"]
    assert (
        good["corectl_backup_last_success_timestamp_seconds"] == good["corectl_backup_last_attempt_timestamp_seconds"]
    )
    (head / "bin" / "mysqldump").write_text("#!/bin/sh\nexit 2\n")
    assert program(head, "take").returncode == 1
    bad = metrics()
    assert bad["corectl_backup_last_attempt_ok"] == 0
    assert bad["corectl_backup_last_success_timestamp_seconds"] == good["corectl_backup_last_success_timestamp_seconds"]
    assert bad["corectl_backup_kept"] == 1
    # no textfile directory on this host: nothing written, the backup taken all the same
    (head / "bin" / "mysqldump").write_text(f"#!/bin/sh\nprintf '%s' '{DUMP}'\n")
    (head / "backup.json").write_text(json.dumps({**settings, "metrics_dir": str(head / "nowhere")}))
    assert program(head, "take").returncode == 0 and not (head / "nowhere").exists()


class TsdbApi(http.server.BaseHTTPRequestHandler):
    """The two calls of Prometheus's HTTP API the backup makes, answered as Prometheus 2.x answers them: the
    flags (storage.tsdb.path) and a snapshot (hard links of the blocks under <tsdb>/snapshots/<name>), or 403 when
    the admin API is off."""

    tsdb: Path
    admin_api = True

    def log_message(self, *_: object) -> None:
        return

    def answer(self, code: int, body: dict | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        assert self.path == "/api/v1/status/flags", self.path
        self.answer(200, {"status": "success", "data": {"storage.tsdb.path": str(self.tsdb)}})

    def do_POST(self) -> None:
        assert self.path == "/api/v1/admin/tsdb/snapshot", self.path
        if not self.admin_api:
            self.answer(403, '{"status":"error","errorType":"unavailable","error":"admin APIs disabled"}')
            return
        name = "20261126T180000Z-2be650b6d019eb54"
        block = self.tsdb / "snapshots" / name / "01JDQ5Z0000000000000000000"
        block.mkdir(parents=True)
        for part in ("meta.json", "index", "tombstones"):
            os.link(self.tsdb / "01JDQ5Z0000000000000000000" / part, block / part)
        self.answer(200, {"status": "success", "data": {"name": name}})


@pytest.fixture
def with_prometheus(head: Path) -> Iterator[tuple[Path, type[TsdbApi]]]:
    """The head's Prometheus: a TSDB with one block, its API on a loopback port, named in the settings."""
    tsdb = head / "metrics2"
    block = tsdb / "01JDQ5Z0000000000000000000"
    block.mkdir(parents=True)
    for part in ("meta.json", "index", "tombstones"):
        (block / part).write_text(f"{part} of the block")
    api = type("Api", (TsdbApi,), {"tsdb": tsdb})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = json.loads((head / "backup.json").read_text())
    settings["prometheus_url"] = f"http://127.0.0.1:{server.server_address[1]}"
    (head / "backup.json").write_text(json.dumps(settings))
    yield tsdb, api
    server.shutdown()


def test_a_backup_takes_prometheus_data_through_its_snapshot_api_and_leaves_no_snapshot(
    with_prometheus: tuple[Path, type[TsdbApi]],
):
    tsdb, _ = with_prometheus
    head = tsdb.parent
    taken = program(head, "take", "--json")
    assert taken.returncode == 0, taken.stderr
    [row] = json.loads(taken.stdout)
    assert "prometheus-tsdb.tar.gz" in row["files"] and row["verified"] == "ok"
    backup = Path(row["path"])
    with tarfile.open(backup / "prometheus-tsdb.tar.gz") as tar:
        assert sorted(tar.getnames()) == [
            "prometheus",
            "prometheus/01JDQ5Z0000000000000000000",
            *(f"prometheus/01JDQ5Z0000000000000000000/{p}" for p in ("index", "meta.json", "tombstones")),
        ]
    assert json.loads((backup / "MANIFEST.json").read_text())["prometheus_tsdb"] == str(tsdb)
    assert list((tsdb / "snapshots").iterdir()) == []  # the snapshot's hard links are gone from Prometheus's disk


def test_a_backup_fails_whole_when_prometheus_admin_api_is_off(with_prometheus: tuple[Path, type[TsdbApi]]):
    tsdb, api = with_prometheus
    api.admin_api = False
    failed = program(tsdb.parent, "take")
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        "corectl-backup: Prometheus /api/v1/admin/tsdb/snapshot: HTTP 403: "
        '{"status":"error","errorType":"unavailable","error":"admin APIs disabled"}'
    )
    assert list((tsdb.parent / "backups").iterdir()) == []


def test_a_restore_puts_prometheus_data_back_once_prometheus_is_stopped(
    with_prometheus: tuple[Path, type[TsdbApi]], monkeypatch: pytest.MonkeyPatch
):
    tsdb, _ = with_prometheus
    head = tsdb.parent
    restore_tools(head, monkeypatch)
    [row] = json.loads(program(head, "take", "--json").stdout)
    # after the backup the head died: its replacement's Prometheus has a fresh, empty TSDB
    shutil.rmtree(tsdb)
    (tsdb / "wal").mkdir(parents=True)
    (head / "active").write_text("prometheus\n")
    refused = program(head, "restore", row["name"])
    assert (refused.returncode, refused.stderr.strip()) == (3, "corectl-backup: prometheus running: stop it first")
    assert sorted(p.name for p in tsdb.iterdir()) == ["wal"]
    (head / "active").write_text("")
    done = program(head, "restore", row["name"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["prometheus"] == str(tsdb)
    assert (tsdb / "01JDQ5Z0000000000000000000" / "meta.json").read_text() == "meta.json of the block"
    assert sorted(p.name for p in (head / f"metrics2.before-restore-{row['name']}").iterdir()) == ["wal"]
    assert not list(head.glob(".metrics2.restoring"))


FAKE_SSH = """#!/bin/sh
# a backup host in a directory of this machine: the remote command runs here; the options are recorded
printf '%s\\036' "$*" >> "$FAKE_SSH_LOG"
while [ "$1" != "--" ]; do shift; done
shift
exec sh -c "$1"
"""


@pytest.fixture
def over_ssh(head: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The head's settings pointing at a backup host over SSH (an ssh on PATH that runs the command here)."""
    (head / "bin" / "ssh").write_text(FAKE_SSH)
    (head / "bin" / "ssh").chmod(0o755)
    monkeypatch.setenv("FAKE_SSH_LOG", str(head / "ssh.log"))
    settings = json.loads((head / "backup.json").read_text())
    settings["destination"] = str(head / "backup-host" / "corectl")
    settings["staging"] = str(head / "staging")
    settings["ssh"] = {"host": "backup01", "port": 2222, "user": "corectl-backup", "key": "/etc/corectl/backup-ssh/id",
                       "known_hosts": "/etc/corectl/backup-ssh/known_hosts"}  # fmt: skip
    (head / "backup.json").write_text(json.dumps(settings))
    return head


def test_backups_to_a_backup_host_go_over_ssh_and_verify_there(over_ssh: Path):
    head = over_ssh
    names = []
    for _ in range(3):
        taken = program(head, "take", "--json")
        assert taken.returncode == 0, taken.stderr
        [row] = json.loads(taken.stdout)
        assert (
            row["verified"] == "ok"
            and row["path"] == f"corectl-backup@backup01:{head}/backup-host/corectl/{row['name']}"
        )
        names.append(row["name"])
    kept = sorted(p.name for p in (head / "backup-host" / "corectl").iterdir())
    assert kept == names[1:]  # retention 2, on the backup host; nothing half-sent left there
    assert list((head / "staging").iterdir()) == []  # and nothing left on the head
    assert oct((head / "backup-host" / "corectl").stat().st_mode & 0o777) == "0o700"
    with tarfile.open(head / "backup-host" / "corectl" / names[-1] / "slurmctld-state.tar.gz") as tar:
        assert "slurmctld/job_state" in tar.getnames()
    # every ssh call: the site's key, its known host key only, never a prompt
    calls = (head / "ssh.log").read_text().split("\x1e")[:-1]
    assert calls and all(
        call.startswith(
            "-i /etc/corectl/backup-ssh/id -p 2222 -o BatchMode=yes -o StrictHostKeyChecking=yes "
            "-o UserKnownHostsFile=/etc/corectl/backup-ssh/known_hosts "
        )
        and " corectl-backup@backup01 -- sh -c " in call
        for call in calls
    ), calls
    # a byte changed on the backup host: the listing over ssh names it
    flip_byte(head / "backup-host" / "corectl" / names[-1] / "slurm_acct_db.sql.gz", 3)
    listed = {row["name"]: row["verified"] for row in json.loads(program(head, "list", "--json").stdout)}
    assert listed == {names[1]: "ok", names[2]: "corrupt: slurm_acct_db.sql.gz does not match its checksum"}
    assert program(head, "verify", names[1]).stdout.strip() == f"{names[1]}: ok"


def test_a_restore_check_fetches_the_backup_from_the_backup_host(over_ssh: Path, monkeypatch: pytest.MonkeyPatch):
    head = over_ssh
    (head / "bin" / "mysql").write_text(FAKE_MYSQL)
    (head / "bin" / "mysql").chmod(0o755)
    monkeypatch.setenv("FAKE_MYSQL_LOG", str(head / "mysql.log"))
    [row] = json.loads(program(head, "take", "--json").stdout)
    checked = program(head, "restore", "latest", "--check")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["backup"] == row["name"]
    assert list((head / "staging").iterdir()) == []  # the fetched copy is gone again
    missing = program(head, "restore", "20200101T000000Z", "--check")
    assert (missing.returncode, missing.stderr.strip()) == (
        3,
        f"corectl-backup: no backup 20200101T000000Z in corectl-backup@backup01:{head}/backup-host/corectl/",
    )


def test_a_backup_host_that_refuses_leaves_nothing_behind(over_ssh: Path):
    head = over_ssh
    (head / "bin" / "ssh").write_text(
        "#!/bin/sh\necho 'corectl-backup@backup01: Permission denied (publickey).' >&2\nexit 255\n"
    )
    failed = program(head, "take")
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        "corectl-backup: on backup01 (ssh rc 255): corectl-backup@backup01: Permission denied (publickey)."
    )
    assert not (head / "staging").exists() or list((head / "staging").iterdir()) == []


def test_a_state_file_renamed_while_it_is_archived_is_left_out(head: Path, monkeypatch: pytest.MonkeyPatch):
    """slurmctld keeps running during a backup (on a second controller too): a file listed and then renamed away
    (its heartbeat.new, a job_state.new) is left out, the rest archived, and the backup taken."""
    module = shipped(PROGRAM, "corectl_backup")
    (head / "slurmctld" / "heartbeat.new").write_bytes(b"beat")
    gettarinfo = module.tarfile.TarFile.gettarinfo

    def renamed_away(self, name=None, arcname=None, fileobj=None):
        if str(name).endswith("heartbeat.new"):  # listed, then renamed by slurmctld before it is read
            raise FileNotFoundError(2, "No such file or directory", str(name))
        return gettarinfo(self, name, arcname, fileobj)

    monkeypatch.setattr(module.tarfile.TarFile, "gettarinfo", renamed_away)
    module.archive(head / "slurmctld", head / "state.tar.gz")
    with tarfile.open(head / "state.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["slurmctld", "slurmctld/assoc_usage", "slurmctld/job_state"]
