"""backup: a backup of the head node now, or the list of those kept. Role backup's corectl-backup on the
accounting database's host (playbooks/backup.yml) dumps the database in one transaction and archives slurmctld's
saved state; this command adds what corectl keeps on the control host (the site directory: run records, failure
history, health verdicts, heal's evidence, cluster.yml, the vault-encrypted secrets; never the vault password)."""

from __future__ import annotations

import json
import sqlite3
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from corectl import ansible
from corectl.ansible import Returned, RunRequest
from corectl.errors import CorectlError
from corectl.progress import LiveProgress
from corectl.site import Site
from corectl.site.context import Context

RETURNED = "corectl_backup"  # playbooks/backup.yml hands the program's answer back under it
# the site directory's entries a backup leaves out: the vault password (a backup keeps secrets encrypted, and the
# key elsewhere), the lab's containers, caches, the lock, and the history database (added as a consistent copy)
LEFT_OUT = frozenset({".vault-pass", ".lab", ".facts", ".lock", ".history.sqlite"})
SITE_ARCHIVE = "corectl-site.tar.gz"


@dataclass(frozen=True)
class Kept:
    name: str
    created: str
    age_s: int
    size: int
    files: tuple[str, ...]
    verified: str  # "ok", or what is wrong
    path: str  # where it is: a directory of the head, or user@host:directory on the backup host


def site_archive(site: Site, directory: Path) -> Path:
    """The site directory as corectl keeps it, with a consistent copy of the failure history (SQLite's backup)."""
    target = directory / SITE_ARCHIVE
    with tarfile.open(target, "w:gz") as tar:
        for entry in sorted(site.directory.iterdir()):
            if entry.name not in LEFT_OUT:
                tar.add(entry, arcname=f"{site.name}/{entry.name}")
        if site.history_db.exists():
            copy = directory / site.history_db.name
            with sqlite3.connect(site.history_db) as source, sqlite3.connect(copy) as snapshot:
                source.backup(snapshot)
            tar.add(copy, arcname=f"{site.name}/{site.history_db.name}")
    target.chmod(0o600)
    return target


@dataclass(frozen=True)
class Backups:
    head: str
    destination: str  # head:directory, or user@host:directory on the backup host
    kept: list[Kept]
    list_only: bool  # False: kept holds the backup just taken


def backup(ctx: Context, console: Console, list_only: bool) -> Backups:
    site, cluster = ctx.site, ctx.rendered()
    if cluster.config.backup is None:
        raise CorectlError(f"{site.cluster_file}: backup is not set (where backups go, how many are kept)", exit_code=2)
    head = cluster.with_role("slurm_dbd")[0].name
    with tempfile.TemporaryDirectory(prefix="corectl-backup-") as private:
        extravars = {"corectl_backup_action": "list" if list_only else "take"}
        if not list_only:
            extravars["corectl_backup_add"] = str(site_archive(site, Path(private)))
        request = RunRequest.of(
            ctx,
            playbook="backup.yml",
            command="backup --list" if list_only else "backup",
            limit=head,
            extravars=extravars,
            secrets=False,
            fan_out=False,
        )
        with LiveProgress(console, f"backup {site.name}") as progress:
            recorded = Returned(RETURNED, progress)
            ansible.run(request, recorded, cluster=cluster)
    res = recorded.by_host.get(head) or {}
    if res.get("rc") != 0:
        said = recorded.unreachable.get(head) or res.get("stderr") or res.get("msg") or "no result"
        raise CorectlError(f"backup on {head} failed: {str(said).strip()}")
    rows = json.loads(res.get("stdout") or "[]")
    kept = [
        Kept(r["name"], r["created"], int(r["age_s"]), int(r["size"]), tuple(r["files"]), r["verified"], r["path"])
        for r in rows
    ]
    ssh = cluster.config.backup.ssh
    where = (
        f"{ssh.user}@{ssh.host}:{cluster.config.backup.destination}"
        if ssh
        else f"{head}:{cluster.config.backup.destination}"
    )
    return Backups(head, where, kept, list_only)


def size_text(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def age_text(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def backups_json(backups: Backups) -> list[dict[str, object]]:
    return [{**asdict(k), "files": list(k.files), "host": backups.head} for k in backups.kept]


def table(backups: Backups) -> Table:
    where = backups.destination
    shown = Table(title=f"backups on {where}" if backups.list_only else f"backup taken on {where}")
    for column in ("backup", "size", "age", "verified", "holds"):
        shown.add_column(column)
    for k in backups.kept:
        holds = ", ".join(f.split(".")[0] for f in k.files)
        style = None if k.verified == "ok" else "red"
        shown.add_row(k.name, size_text(k.size), age_text(k.age_s), k.verified, holds, style=style)
    return shown
