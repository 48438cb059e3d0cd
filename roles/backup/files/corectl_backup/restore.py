"""Restoring a backup on a replaced head: refused when it does not verify, when the database holds newer jobs
(without --force) or while slurmctld or slurmdbd run; what was found in place is kept aside."""

from __future__ import annotations

import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from .store import MANIFEST, check
from .take import PROMETHEUS_ARCHIVE, PROMETHEUS_TOP


class Refused(Exception):
    """A restore that would lose or break something: nothing was changed."""


def mysql_client() -> str:
    """MariaDB's client (Debian 12 ships both names; newer MariaDB only mariadb)."""
    return shutil.which("mariadb") or shutil.which("mysql") or "mysql"


def mysql(*sql: str) -> str:
    argv = [mysql_client(), "--batch", "--skip-column-names"]
    result = subprocess.run([*argv, "-e", "; ".join(sql)], capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed (rc {result.returncode}): {result.stderr.strip()}")
    return result.stdout


def latest_job(database: str) -> tuple[int, str]:
    """(submit time, job table) of the newest job the accounting database holds; (0, "") when it holds none."""
    if not mysql(f"SHOW DATABASES LIKE '{database}'").strip():
        return 0, ""
    newest = (0, "")
    for table in mysql(f"SHOW TABLES FROM `{database}` LIKE '%\\_job\\_table'").split():
        submitted = mysql(f"SELECT COALESCE(MAX(time_submit), 0) FROM `{database}`.`{table}`").strip()
        newest = max(newest, (int(submitted or 0), table))
    return newest


def state_members(tar: tarfile.TarFile, name: str) -> list[tarfile.TarInfo]:
    """The archive's members, when each lies inside <name>/ and none is a link; else Refused."""
    members = tar.getmembers()
    inside = [m for m in members if m.name == name or m.name.startswith(f"{name}/")]
    unsafe = [m for m in inside if m.issym() or m.islnk() or ".." in Path(m.name).parts]
    if len(inside) != len(members) or unsafe:
        raise Refused(f"{Path(str(tar.name)).name} holds more than {name}/: nothing restored")
    return inside


def restore_check(config: dict, backup: Path, force: bool) -> dict:
    """What a restore of this backup would do; Refused when it must not."""
    if not backup.is_dir():
        raise Refused(f"no backup {backup.name} in {backup.parent}")
    said = check(backup)
    if said != "ok":
        raise Refused(f"backup {backup.name} does not verify ({said}): nothing restored")
    manifest = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
    taken = datetime.datetime.fromisoformat(manifest["created"]).timestamp()
    archived = backup / "slurmctld-state.tar.gz"
    if archived.is_file():
        with tarfile.open(archived) as tar:
            state_members(tar, Path(config["state_dir"]).name)
    if (backup / PROMETHEUS_ARCHIVE).is_file():
        if not Path(manifest.get("prometheus_tsdb", "")).is_absolute():
            raise Refused(f"backup {backup.name} holds Prometheus's data but not where it was: nothing restored")
        with tarfile.open(backup / PROMETHEUS_ARCHIVE) as tar:
            state_members(tar, PROMETHEUS_TOP)
    submitted, table = latest_job(config["database"])
    if submitted > taken and not force:
        when = datetime.datetime.fromtimestamp(submitted, datetime.UTC).isoformat(timespec="seconds")
        raise Refused(
            f"the accounting database holds jobs submitted after backup {backup.name} (in {table}, the newest "
            f"at {when}): a restore would lose them; --force to restore anyway"
        )
    return {"backup": backup.name, "created": manifest["created"], "files": sorted(manifest["files"])}


def active(unit: str) -> bool:
    result = subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False)
    return result.returncode == 0


def unpack(archived: Path, top: str, target: Path, backup: str) -> str:
    """The archive's one directory `top` becomes `target` (owned as what was there); what was there is moved beside
    it as <target>.before-restore-<backup>, whose path is returned ("" when there was nothing)."""
    owner = target.stat() if target.exists() else target.parent.stat()
    aside = ""
    if target.exists():
        kept = target.with_name(f"{target.name}.before-restore-{backup}")
        shutil.rmtree(kept, ignore_errors=True)
        # a rename where it can, else a copy and a delete: a directory the node's image brought (an overlay
        # root, a package's directory in a container image) refuses to be renamed (EXDEV)
        shutil.move(target, kept)
        aside = str(kept)
    landing = target.with_name(f".{target.name}.restoring")
    shutil.rmtree(landing, ignore_errors=True)
    landing.mkdir(mode=0o700)
    with tarfile.open(archived) as tar:
        members = state_members(tar, top)
        try:
            tar.extractall(landing, members=members, filter="tar")
        except TypeError:  # a Python without extraction filters (before 3.11.4): the names were checked
            tar.extractall(landing, members=members)
    (landing / top).rename(target)
    landing.rmdir()
    for path in [target, *target.rglob("*")]:
        os.chown(path, owner.st_uid, owner.st_gid)
    return aside


def saved_state_present(state: Path) -> bool:
    """Whether slurmctld's state directory holds a saved state. It is newer than any backup (a head whose state
    lives on shared storage, a backup controller's that kept control): the restore keeps it, or the jobs started
    since the backup would be killed as unknown and the accounting records a backup controller queued in it lost."""
    return (state / "job_state").is_file()


def restore(config: dict, backup: Path, force: bool) -> dict:
    """The database from the dump, slurmctld's state (where none is present) and Prometheus's data from their
    archives; what was found in their places is kept aside."""
    done = restore_check(config, backup, force)
    tsdb = backup / PROMETHEUS_ARCHIVE
    units = ("slurmctld", "slurmdbd", *(["prometheus"] if tsdb.is_file() else []))
    running = [unit for unit in units if active(unit)]
    if running:
        raise Refused(f"{' and '.join(running)} running: stop {'them' if len(running) > 1 else 'it'} first")
    mysql(f"DROP DATABASE IF EXISTS `{config['database']}`")
    dump = backup / "slurm_acct_db.sql.gz"
    loader = [mysql_client()]
    with gzip.open(dump, "rb") as source:
        proc = subprocess.Popen(loader, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None
        for block in iter(lambda: source.read(1 << 20), b""):
            proc.stdin.write(block)
        _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"loading {dump.name} failed (rc {proc.returncode}): {err.decode(errors='replace').strip()}")
    state = Path(config["state_dir"])
    archived = backup / "slurmctld-state.tar.gz"
    if archived.is_file() and saved_state_present(state):
        done["state_kept"] = str(state)
    elif archived.is_file():
        aside = unpack(archived, state.name, state, backup.name)
        if aside:
            done["kept_aside"] = aside
        done["state"] = str(state)
    if tsdb.is_file():
        manifest = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
        target = Path(manifest["prometheus_tsdb"])
        unpack(tsdb, PROMETHEUS_TOP, target, backup.name)
        done["prometheus"] = str(target)
    return done


def restore_command(config: dict, backup: Path, check_only: bool, force: bool) -> int:
    """0: restored (or, with check_only, would be); 3: refused, nothing changed; 1: failed on the way."""
    try:
        run = restore_check if check_only else restore
        print(json.dumps(run(config, backup, force), indent=2))
    except Refused as exc:
        print(f"corectl-backup: {exc}", file=sys.stderr)
        return 3
    except (OSError, RuntimeError) as exc:
        print(f"corectl-backup: {exc}", file=sys.stderr)
        return 1
    return 0
