"""Taking a backup: the accounting database's dump, slurmctld's saved state and Prometheus's data archived, the
manifest written last; the oldest beyond the retention removed; the outcome for node_exporter."""

from __future__ import annotations

import contextlib
import datetime
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .store import FORMAT, MANIFEST, Store, describe, sha256, store_of


def dump_database(name: str, target: Path) -> None:
    """The accounting database as one transaction (InnoDB: readers see one snapshot, slurmdbd keeps writing)."""
    dump = shutil.which("mariadb-dump") or shutil.which("mysqldump") or "mysqldump"
    argv = [dump, "--single-transaction", "--routines", "--triggers", "--databases", name]
    with gzip.open(target, "wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        for block in iter(lambda: proc.stdout.read(1 << 20), b""):
            out.write(block)
        _, err = proc.communicate()
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip()
        raise RuntimeError(f"{Path(argv[0]).name} failed (rc {proc.returncode}): {said}")


def archive(source: Path, target: Path, arcname: str | None = None) -> None:
    """`source` as one directory (named `arcname`) in a tar.gz. A file or directory that goes away while it is read
    is left out: slurmctld, running, writes each state file as <name>.new and renames it, rewrites its heartbeat,
    and removes the script directories of ended jobs."""
    top = arcname or source.name
    with tarfile.open(target, "w:gz") as tar:
        tar.add(source, arcname=top, recursive=False)
        for directory, subdirectories, files in os.walk(source):  # os.walk passes over what vanishes
            subdirectories.sort()  # in place: os.walk descends in this order too
            for name in [*subdirectories, *sorted(files)]:
                path = Path(directory) / name
                with contextlib.suppress(FileNotFoundError):
                    tar.add(path, arcname=f"{top}/{path.relative_to(source).as_posix()}", recursive=False)


PROMETHEUS_ARCHIVE = "prometheus-tsdb.tar.gz"
PROMETHEUS_TOP = "prometheus"  # the one directory the archive holds


def prometheus_api(url: str, path: str, post: bool = False) -> dict:
    request = urllib.request.Request(f"{url.rstrip('/')}{path}", method="POST" if post else "GET")
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as exc:  # e.g. 403 "admin APIs disabled"
        said = exc.read().decode(errors="replace").strip()
        raise RuntimeError(f"Prometheus {path}: HTTP {exc.code}: {said}") from exc
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"Prometheus {path}: {exc}") from exc


def prometheus_snapshot(url: str, target: Path) -> str:
    """Prometheus's TSDB through its snapshot API (blocks hard-linked, the head written out), archived; the snapshot
    is removed from Prometheus's data directory after. Returns that directory (restore puts the data back there)."""
    tsdb = Path(prometheus_api(url, "/api/v1/status/flags")["data"]["storage.tsdb.path"])
    if not tsdb.is_absolute():
        raise RuntimeError(f"Prometheus's storage.tsdb.path {tsdb} is not absolute: set it with its full path")
    name = prometheus_api(url, "/api/v1/admin/tsdb/snapshot", post=True)["data"]["name"]
    snapshot = tsdb / "snapshots" / name
    try:
        archive(snapshot, target, arcname=PROMETHEUS_TOP)
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    return str(tsdb)


def take(config: dict, added: list[str]) -> dict:
    store = store_of(config)
    name = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    taken = store.names()
    while name in taken:  # two in one second
        name += "-1"
    partial = store.partial(name)
    try:
        dump_database(config["database"], partial / "slurm_acct_db.sql.gz")
        state = Path(config["state_dir"])
        if state.is_dir():
            archive(state, partial / "slurmctld-state.tar.gz")
        tsdb = None
        if config.get("prometheus_url"):
            tsdb = prometheus_snapshot(config["prometheus_url"], partial / PROMETHEUS_ARCHIVE)
        for path in map(Path, added):
            shutil.copyfile(path, partial / path.name)
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256(p)} for p in sorted(partial.iterdir())}
        manifest = {
            "format": FORMAT,
            "name": name,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": socket.gethostname().split(".")[0],
            "database": config["database"],
            "files": files,
        }
        if tsdb:
            manifest["prometheus_tsdb"] = tsdb
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        store.commit(partial, name)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    prune(store, int(config["retention"]))
    return describe(store, name)


def prune(store: Store, keep: int) -> None:
    """The newest `keep` backups stay; older ones, and parts of backups that never finished, go."""
    for old in store.names()[:-keep] if keep > 0 else []:
        store.remove(old)
    store.discard_partials()


METRICS_FILE = "corectl_backup.prom"


def read_metrics(path: Path) -> dict[str, float]:
    values: dict[str, float] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return values
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name and not name.startswith("#"):
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


def write_metrics(config: dict, ok: bool, taken: dict | None) -> None:
    """The outcome of this attempt, keeping the time of the last success across failures."""
    directory = Path(config.get("metrics_dir") or "")
    if not config.get("metrics_dir") or not directory.is_dir():
        return
    path = directory / METRICS_FILE
    values = read_metrics(path)
    now = time.time()
    values["corectl_backup_last_attempt_timestamp_seconds"] = now
    values["corectl_backup_last_attempt_ok"] = 1.0 if ok else 0.0
    if ok and taken is not None:
        values["corectl_backup_last_success_timestamp_seconds"] = now
        values["corectl_backup_last_size_bytes"] = float(taken["size"])
    try:
        values["corectl_backup_kept"] = float(len(store_of(config).names()))
    except (OSError, RuntimeError):  # the backup host does not answer: the count is unknown
        values.pop("corectl_backup_kept", None)
    helps = {
        "corectl_backup_last_attempt_timestamp_seconds": "When corectl-backup last tried to take a backup.",
        "corectl_backup_last_attempt_ok": "Whether that attempt succeeded (1) or failed (0).",
        "corectl_backup_last_success_timestamp_seconds": "When the last backup that succeeded was taken.",
        "corectl_backup_last_size_bytes": "The size of the last backup that succeeded.",
        "corectl_backup_kept": "Complete backups in the destination.",
    }
    lines = []
    for name, text in helps.items():
        if name in values:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {values[name]:.0f}"]
    partial = path.with_name(f".{METRICS_FILE}.tmp")
    try:
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        partial.chmod(0o644)
        partial.replace(path)
    except OSError as exc:  # the backup stands; only its metrics are missing
        print(f"corectl-backup: metrics not written: {exc}", file=sys.stderr)
