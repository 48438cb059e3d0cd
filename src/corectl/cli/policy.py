"""What every command line shares: which site, one changing command per site (the lock), how a
run's result becomes an exit code with the next step, and the password and host-key prompts."""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from corectl.cli.app import err, out
from corectl.errors import CorectlError
from corectl.site import Site, require_cluster_file, resolve_site
from corectl.site.context import Context

if TYPE_CHECKING:
    from corectl.ansible import RunResult
    from corectl.commands.bootstrap import Login


def site(inventory: str | None) -> Site:
    return resolve_site(inventory)


def existing_site(inventory: str | None) -> Site:
    """The site, which must have its cluster.yml (a command that asks for a password first says so before asking)."""
    target = resolve_site(inventory)
    require_cluster_file(target)
    return target


# What each command does to its site, declared once. CHANGES: it holds the site's lock (changing(), below) for all
# of its work, so a second changing command is refused with exit 75 or waits (--wait). READS: it never takes the
# lock and never waits for it, and writes nothing to the site (reading(): no inventory, run record or history row).
# RECORDS: no lock either, but it keeps what it found (recording(): health's verdicts, a plan's run record). A
# command whose option switches it to another kind is listed again with that option ("health --burn-in").
# NEW_SITE: init (the site must not exist yet); MACHINE: the lab's image and package repository, of this machine,
# no site's. tests/unit/test_command_locks.py runs every CHANGES entry under a held lock (refused, the site
# byte-identical), every READS entry (the site byte-identical after it), and fails for a command of the app that
# is missing here.
CHANGES, READS, RECORDS, NEW_SITE, MACHINE = "changes", "reads", "records", "new site", "machine"
COMMAND_LOCKS: dict[str, str] = {
    "add-node": CHANGES,
    "backup": CHANGES,
    "backup --list": READS,
    "bootstrap": CHANGES,
    "drain": CHANGES,
    "heal": CHANGES,
    "health": RECORDS,
    "health --burn-in": CHANGES,  # resumes the nodes it tested and drains a slow one
    "history": READS,
    "init": NEW_SITE,
    "lab add": CHANGES,
    "lab down": CHANGES,
    "lab image": MACHINE,
    "lab replace": CHANGES,
    "lab repo": MACHINE,
    "lab up": CHANGES,
    "logs": READS,
    "plan": RECORDS,
    "power": CHANGES,
    "power status": READS,
    "provision": CHANGES,
    "remove-node": CHANGES,
    "render": CHANGES,
    "render --check": READS,
    "report": READS,
    "restore": CHANGES,
    "resume": CHANGES,
    "rma": READS,
    "runners bootstrap": CHANGES,  # the runner hosts a provision fans out over
    "runs": READS,
    "schema": READS,
    "secrets backup-key": READS,
    "secrets check": READS,
    "secrets init": CHANGES,
    "secrets set-bmc": CHANGES,
    "secrets set-ceph-key": CHANGES,
    "secrets set-webhook": CHANGES,
    "status": READS,
    "upgrade drivers": CHANGES,
    "upgrade os": CHANGES,
    "upgrade slurm": CHANGES,
    "validate": READS,
    "validate-nodes": CHANGES,
}


@contextlib.contextmanager
def changing(target: Site, wait: float) -> Iterator[Context]:
    """Hold the site's lock (one changing command per site; the holder is this command line) and give the
    command its context (corectl.site.context), which renders the inventory when stale."""
    from corectl.lock import site_lock

    if not target.directory.is_dir():  # no such site: the command says so itself, and nothing is created
        yield Context(target)
        return
    command = shlex.join(sys.argv[1:])
    with site_lock(target, command, wait=wait, warn=warn):
        yield Context(target)


def reading(inventory: str | None) -> Context:
    """A READS command's context: it writes nothing to the site (no inventory, run record or history row)."""
    return Context(resolve_site(inventory), writes=False, warn=warn)


def recording(inventory: str | None) -> Context:
    """A RECORDS command's context: no lock; it keeps what it found (verdicts, its run record)."""
    return Context(resolve_site(inventory))


def warn(line: str) -> None:
    err.print(line, markup=False, soft_wrap=True)


def require_ok(result: RunResult, what: str, *, per_host: bool = False) -> None:
    """A run with failed or unreachable hosts (or none that ran) ends the command non-zero, with
    the next step in its last line. ``per_host``: a rerun can be limited to the failed hosts."""
    if result.ok:
        return
    if result.status == "canceled":
        raise CorectlError(
            f"{what} canceled after {result.elapsed:.0f}s ({len(result.hosts)} hosts reached, counts above); "
            "running it again is safe and continues where it stopped",
            exit_code=130,
        )
    failed = result.failed_hosts
    if not failed:
        tail = result.output_tail(1)
        raise CorectlError(f"{what} failed: {result.status}: {tail[-1] if tail else 'no output'}")
    unreachable = [h for h in failed if result.hosts[h].unreachable]
    parts = [f"unreachable: {', '.join(unreachable)}"] if unreachable else []
    if len(unreachable) < len(failed):
        parts.append(f"failed: {', '.join(h for h in failed if h not in unreachable)}")
    retry = f"retry just those: {with_limit(failed)}" if per_host else "fix the cause and run it again"
    raise CorectlError(f"{what} failed ({'; '.join(parts)}); {retry}")


def with_limit(hosts: list[str]) -> str:
    """This command line with ``--limit`` set to ``hosts``."""
    argv, kept = sys.argv[1:], []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--limit", "-l"):
            skip = True
        elif not arg.startswith("--limit="):
            kept.append(arg)
    return "corectl " + shlex.join([*kept, "--limit", ",".join(hosts)])


def bootstrap_login(user: str, password_env: str | None, key: Path | None) -> Login:
    from corectl.commands.bootstrap import Login

    password = None
    if password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise CorectlError(f"--password-env {password_env}: not set", exit_code=2)
    elif key is None or user != "root":
        password = getpass.getpass(f"password of {user} on the nodes: ")
    return Login(user, password, key)


def host_key_prompt(yes: bool) -> Callable[[str, str], bool]:
    def accept(node: str, shown: str) -> bool:
        out.print(f"{node}: host key {shown}", highlight=False)
        return yes or typer.confirm(f"accept the host key of {node}?")

    return accept
