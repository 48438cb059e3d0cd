"""Where backups are kept (a directory here, or one on a backup host over SSH), the settings, and whether a backup
verifies: its manifest against each file's size and SHA-256."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

STAGING = "/var/lib/corectl/backup-staging"  # a backup for (or from) a backup host, while it travels
MANIFEST = "MANIFEST.json"
FORMAT = 1
# A backup's name: the UTC time it was taken (take.py), "-1" added for a second one in the same second. Anything else
# in the destination (a disk's lost+found, an operator's folder) is not a backup: never listed, pruned or restored.
NAME = re.compile(r"^\d{8}T\d{6}Z(?:-1)*$")


def ours(names: list[str]) -> list[str]:
    """corectl's own backups among ``names``, oldest first."""
    return sorted(name for name in names if NAME.match(name))


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    for key in ("destination", "retention", "database", "state_dir"):
        if key not in config:
            raise ValueError(f"{path}: {key} missing")
    return config


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Local:
    """Backups in a directory of this host (shared storage, or a mounted disk)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def where(self, name: str) -> str:
        return str(self.root / name)

    def names(self) -> list[str]:
        """The complete backups, oldest first (their names are UTC times)."""
        if not self.root.is_dir():
            return []
        return ours([p.name for p in self.root.iterdir() if p.is_dir()])

    def partial(self, name: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = self.root / f".{name}.partial"
        partial.mkdir(mode=0o700)
        return partial

    def commit(self, partial: Path, name: str) -> None:
        os.sync()
        partial.rename(self.root / name)

    def facts(self, name: str) -> tuple[str, dict[str, tuple[int, str]]]:
        """The manifest's text ("" when unreadable) and each file's size and SHA-256."""
        backup = self.root / name
        files = {p.name: (p.stat().st_size, sha256(p)) for p in backup.iterdir() if p.is_file()}
        try:
            return (backup / MANIFEST).read_text(encoding="utf-8"), files
        except OSError:
            return "", files

    def remove(self, name: str) -> None:
        shutil.rmtree(self.root / name)

    def discard_partials(self) -> None:
        for partial in self.root.glob(".*.partial"):
            shutil.rmtree(partial, ignore_errors=True)

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        yield self.root / name


# what the backup host runs, with sh and coreutils only: each regular file's size, SHA-256 and name, then the
# manifest after a line "---"
FACTS_SCRIPT = """cd "$1" || exit 3
for f in *; do
  [ -f "$f" ] || continue
  printf '%s %s %s\\n' "$(stat -c %s -- "$f")" "$(sha256sum -- "$f" | cut -d' ' -f1)" "$f"
done
printf -- '---\\n'
cat MANIFEST.json 2>/dev/null || true"""


class Remote:
    """Backups in a directory of a backup host over SSH (its key and host key in the settings): written here under
    the staging directory first, then sent with tar and renamed there when whole; read back the same way."""

    def __init__(self, root: str, ssh: dict, staging: Path) -> None:
        self.root, self.ssh, self.staging = root, ssh, staging

    def where(self, name: str) -> str:
        return f"{self.ssh['user']}@{self.ssh['host']}:{self.root}/{name}"

    def argv(self, *remote: str) -> list[str]:
        options = ["-i", self.ssh["key"], "-p", str(self.ssh["port"]), "-o", "BatchMode=yes"]
        options += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.ssh['known_hosts']}"]
        options += ["-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=30"]
        return ["ssh", *options, f"{self.ssh['user']}@{self.ssh['host']}", "--", shlex.join(remote)]

    def run(self, script: str, *args: str, stdin: object = None, stdout: object = subprocess.PIPE) -> str:
        """`sh -c script` on the backup host with args as $1...; RuntimeError with what it said when it fails."""
        argv = self.argv("sh", "-c", script, "sh", *args)
        done = subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, check=False, timeout=86400)
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()
            raise RuntimeError(f"on {self.ssh['host']} (ssh rc {done.returncode}): {said}")
        return done.stdout.decode(errors="replace") if isinstance(done.stdout, bytes) else ""

    def names(self) -> list[str]:
        found = "[ -d \"$1\" ] || exit 0; find \"$1\" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\\n'"
        return ours(self.run(found, self.root).split())

    def partial(self, name: str) -> Path:
        self.staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = self.staging / f".{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        return partial

    def commit(self, partial: Path, name: str) -> None:
        """tar's stream into the destination as .<name>.partial, renamed there once whole."""
        receive = 'umask 077; mkdir -p "$1" && tar -C "$1" -xf - && mv "$1/$2" "$1/$3"'
        try:
            with subprocess.Popen(["tar", "-C", str(self.staging), "-cf", "-", partial.name],
                                  stdout=subprocess.PIPE) as sender:  # fmt: skip
                self.run(receive, self.root, partial.name, name, stdin=sender.stdout)
            if sender.returncode != 0:
                raise RuntimeError(f"tar of {partial} failed (rc {sender.returncode})")
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def facts(self, name: str) -> tuple[str, dict[str, tuple[int, str]]]:
        listing, _, manifest = self.run(FACTS_SCRIPT, f"{self.root}/{name}").partition("---\n")
        files = {}
        for line in listing.splitlines():
            size, digest, file = line.split(" ", 2)
            files[file] = (int(size), digest)
        return manifest, files

    def remove(self, name: str) -> None:
        self.run('rm -rf -- "$1"', f"{self.root}/{name}")

    def discard_partials(self) -> None:
        self.run("[ -d \"$1\" ] || exit 0; find \"$1\" -mindepth 1 -maxdepth 1 -name '.*.partial' -exec rm -rf {} +",
                 self.root)  # fmt: skip

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        """The backup fetched into the staging directory (removed after)."""
        self.staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        copy = self.staging / name
        shutil.rmtree(copy, ignore_errors=True)
        try:
            with subprocess.Popen(["tar", "-C", str(self.staging), "-xf", "-"], stdin=subprocess.PIPE) as receiver:
                self.run('tar -C "$1" -cf - "$2"', self.root, name, stdout=receiver.stdin)
                assert receiver.stdin is not None
                receiver.stdin.close()
            if receiver.returncode != 0:
                raise RuntimeError(f"unpacking {name} from {self.ssh['host']} failed (rc {receiver.returncode})")
            yield copy
        finally:
            shutil.rmtree(copy, ignore_errors=True)


Store = Local | Remote


def store_of(config: dict) -> Store:
    if config.get("ssh"):
        return Remote(config["destination"], config["ssh"], Path(config.get("staging") or STAGING))
    return Local(Path(config["destination"]))


def verdict(manifest_text: str, files: dict[str, tuple[int, str]]) -> str:
    """ "ok", or what is wrong with a backup of this manifest and these files (size, SHA-256)."""
    try:
        manifest = json.loads(manifest_text)
    except ValueError:
        return "incomplete: no readable manifest"
    for name, want in sorted(manifest.get("files", {}).items()):
        if name not in files:
            return f"corrupt: {name} missing"
        if files[name] != (want["size"], want["sha256"]):
            return f"corrupt: {name} does not match its checksum"
    return "ok"


def check(backup: Path) -> str:
    """ "ok", or what is wrong with this backup directory of this host."""
    return verdict(*Local(backup.parent).facts(backup.name))


def describe(store: Store, name: str) -> dict:
    text, files = store.facts(name)
    try:
        manifest = json.loads(text)
    except ValueError:
        manifest = {}
    created = manifest.get("created", "")
    age = time.time() - datetime.datetime.fromisoformat(created).timestamp() if created else 0
    return {
        "name": name,
        "path": store.where(name),
        "created": created,
        "age_s": int(age),
        "size": sum(size for size, _ in files.values()),
        "files": sorted(manifest.get("files", {})),
        "verified": verdict(text, files),
    }
