"""Runner hosts (cluster.yml `control.runners`): how corectl installs onto them and reaches them.

`corectl runners bootstrap` copies the control host's own ansible-core, ansible-runner (with
their dependencies, file for file, from corectl's Python environment) and the collections the
roles use into ``runner_dir``; a stamp names those exact versions. Every job checks the stamp
before the worker starts, so a runner left behind by an upgrade of the control host refuses the
job instead of running other versions. The runner needs only python3 of the same minor version
and OpenSSH's client (ssh, ssh-agent).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path, PurePosixPath
from subprocess import DEVNULL, Popen, TimeoutExpired

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from corectl.errors import CorectlError
from corectl.site import Site
from corectl.site.model_services import RunnerHost

TOP_PACKAGES = ("ansible-runner", "ansible-core")
ACCELERATOR_PACKAGE = "mitogen"  # its ansible_mitogen package holds the strategy plugin
# The collections the roles and playbooks name (tests/unit/test_fanout_units.py scans them for others).
COLLECTIONS = ("ansible.posix", "community.general", "community.mysql")
ENTRY_POINTS = ("ansible-runner", "ansible-playbook")
PLAIN_PATH = re.compile(r"^[A-Za-z0-9._/@+-]+$")
STALE_EXIT = 97  # the worker's exit when the runner's stamp is not the control host's
UNFIT_EXIT = 98  # the worker's exit when python3 there is not the control host's minor version
CONNECT_TIMEOUT = 10


def top_packages() -> tuple[str, ...]:
    """What a runner gets: ansible-runner and ansible-core, and Mitogen when it is installed here
    (CORECTL_ACCELERATOR=mitogen then runs jobs on the runners under Mitogen too)."""
    try:
        metadata.distribution(ACCELERATOR_PACKAGE)
    except metadata.PackageNotFoundError:
        return TOP_PACKAGES
    return (*TOP_PACKAGES, ACCELERATOR_PACKAGE)


def closure() -> list[metadata.Distribution]:
    """The installed distributions a runner needs (top_packages() and their dependencies, markers
    evaluated here)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(top_packages())
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise CorectlError(f"{name}: not installed beside corectl (run `make setup`)") from None
        seen[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [seen[name] for name in sorted(seen)]


def _collections_root() -> Path:
    """The `ansible` package's collections, beside corectl."""
    try:
        return Path(str(metadata.distribution("ansible").locate_file("ansible_collections")))
    except metadata.PackageNotFoundError:
        raise CorectlError("ansible (the collections): not installed beside corectl (run `make setup`)") from None


def collection_versions() -> dict[str, str]:
    root = _collections_root()
    versions = {}
    for fqcn in COLLECTIONS:
        manifest = root.joinpath(*fqcn.split("."), "MANIFEST.json")
        if not manifest.is_file():
            raise CorectlError(f"collection {fqcn}: not installed beside corectl (run `make setup`)")
        versions[fqcn] = json.loads(manifest.read_text(encoding="utf-8"))["collection_info"]["version"]
    return versions


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def stamp() -> str:
    """What a runner must hold: Python minor version, every distribution and collection version."""
    pins = {
        "python": python_version(),
        "packages": {dist.metadata["Name"]: dist.version for dist in closure()},
        "collections": collection_versions(),
    }
    return hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:16]


def _script(entry: str, runner_dir: PurePosixPath) -> bytes:
    target = next(ep for ep in metadata.entry_points(group="console_scripts") if ep.name == entry)
    module, _, attr = target.value.partition(":")
    return (
        f"#!/usr/bin/env python3\n# corectl runners bootstrap: {entry} from {runner_dir}/lib\n"
        f"import sys\nsys.path.insert(0, {str(runner_dir / 'lib')!r})\n"
        f"from {module} import {attr}\nsys.exit({attr}())\n"
    ).encode()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _payload_files() -> Iterator[tuple[str, Path]]:
    for dist in closure():
        for item in dist.files or []:
            if item.parts[0] == ".." or "__pycache__" in item.parts:
                continue  # console scripts (rewritten below) and compiled caches
            path = Path(str(dist.locate_file(item)))
            if path.is_file():
                yield f"lib/{item.as_posix()}", path
    root = _collections_root()
    for fqcn in COLLECTIONS:
        base = root.joinpath(*fqcn.split("."))
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(root)
            if path.is_file() and not {"__pycache__", "tests", "docs"}.intersection(relative.parts):
                yield f"lib/ansible_collections/{relative.as_posix()}", path


def payload(runner_dir: PurePosixPath) -> bytes:
    """The gzipped tar `runners bootstrap` unpacks into ``runner_dir``/new."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name, path in _payload_files():
            _add(tar, name, path.read_bytes())
        _add(tar, "lib/ansible_collections/__init__.py", b"")
        for entry in ENTRY_POINTS:
            _add(tar, f"bin/{entry}", _script(entry, runner_dir), 0o755)
    return buffer.getvalue()


def kept_payload(runner_dir: PurePosixPath, digest: str, directory: Path) -> bytes:
    """payload(``runner_dir``), built once per control-host version (``digest``, stamp()) and kept in ``directory``:
    a node-local run's follower processes each need it after an upgrade, and an in-memory cache does not reach
    processes forked before it was filled. The first to need it builds it while the others wait on the lock; a
    payload of another version or install directory is removed then."""
    name = f"{digest}-{hashlib.sha256(str(runner_dir).encode()).hexdigest()[:8]}.tar.gz"
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released as the file closes)
        kept = directory / name
        if kept.is_file():
            return kept.read_bytes()
        data = payload(runner_dir)
        for other in directory.glob("*.tar.gz"):
            other.unlink()
        partial = directory / f"{name}.partial"
        partial.write_bytes(data)
        os.replace(partial, kept)
    return data


def _python_check(what: str, code: int) -> str:
    """sh: exit ``code`` unless python3 there is the control host's minor version (the payload's
    compiled modules are built for it)."""
    major, minor = sys.version_info.major, sys.version_info.minor
    return (
        f"python3 -c 'import sys; sys.exit(sys.version_info[:2] != ({major}, {minor}))' 2>/dev/null "
        f"|| {{ echo 'python3 on this {what} is not {major}.{minor}, the control host'\"'\"'s' >&2; exit {code}; }}; "
    )


def install_script(runner_dir: str, digest: str, what: str = "runner") -> str:
    """Run on the runner or node (sh, the payload on stdin): unpack beside the old install, swap, stamp.
    A runner needs ssh-agent (its jobs reach the nodes with the site key); a node runs against itself."""
    d = shlex.quote(runner_dir)
    agent = "command -v ssh-agent >/dev/null || { echo 'ssh-agent missing (install openssh-client)' >&2; exit 3; }; "
    return (
        "set -eu; umask 022; "
        + _python_check(what, UNFIT_EXIT)
        + (agent if what == "runner" else "")
        + f"mkdir -p {d}; rm -f {d}/stamp; rm -rf {d}/new; mkdir {d}/new; tar -xzf - -C {d}/new; "
        f"rm -rf {d}/lib {d}/bin; mv {d}/new/lib {d}/lib; mv {d}/new/bin {d}/bin; rmdir {d}/new; "
        f"mkdir -p -m 0700 {d}/facts; echo {digest} > {d}/stamp"
    )


def worker_command(runner_dir: str, remote_dir: PurePosixPath, digest: str, what: str = "runner") -> str:
    """The remote command of one job: refuse a host whose python3 cannot run the payload
    (UNFIT_EXIT) or whose install is not the control host's (STALE_EXIT), else
    `ansible-runner worker --delete`."""
    d = shlex.quote(runner_dir)
    return (
        "umask 077; " + _python_check(what, UNFIT_EXIT) + f'test "$(cat {d}/stamp 2>/dev/null)" = {digest} || '
        f"{{ echo '{what} is not at the control host'\"'\"'s versions: run corectl runners bootstrap' >&2; "
        f"exit {STALE_EXIT}; }}; "
        f"PATH={d}/bin:$PATH exec ansible-runner worker --private-data-dir {shlex.quote(str(remote_dir))} --delete"
    )


def cancel_command(remote_dir: PurePosixPath) -> str:
    """Stop a job's worker and Ansible, then remove its directory (the vault password's file).

    The path is written as ``/[d]ev/shm/...``: a regular expression for pkill and a glob for rm
    that both name the directory, while this command's own text does not match the expression
    (pkill would otherwise stop the shell running it). Paths here are corectl's own: no quoting.
    """
    path = str(remote_dir)
    if not path.startswith("/") or len(path) < 3 or not PLAIN_PATH.match(path):
        raise ValueError(f"not a plain absolute path: {path!r}")
    masked = f"/[{path[1]}]{path[2:]}"
    return f"pkill -TERM -f {masked}; sleep 1; pkill -KILL -f {masked}; rm -rf {masked}; true"


def ssh_argv(site: Site, runner: RunnerHost, key: Path | None, command: str, options: Sequence[str] = ()) -> list[str]:
    """ssh to a runner (or a node: ``options``, cluster.ssh's client_options: its key exchange and jump host) with the
    site's key, its host key checked against the site's known_hosts."""
    argv = [
        "ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
        "-o", f"UserKnownHostsFile={site.known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
        "-p", str(runner.port), "-l", runner.user,
    ]  # fmt: skip
    if key is not None:
        argv += ["-i", str(key), "-o", "IdentitiesOnly=yes"]
    return [*argv, *options, runner.host, command]


def run_on(
    site: Site, runner: RunnerHost, key: Path | None, command: str, data: bytes = b"", options: Sequence[str] = ()
) -> str:
    """Run ``command`` on a runner (or a node); its stdout, or a one-line error naming it."""
    argv = ssh_argv(site, runner, key, command, options)
    proc = subprocess.run(argv, input=data, capture_output=True, check=False)
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        raise CorectlError(f"runner {runner.name} ({runner.host}): {said[-1] if said else f'exit {proc.returncode}'}")
    return proc.stdout.decode(errors="replace")


# a job running on a host: its ssh, its directory there, the host, ssh's options for it (ssh_argv)
Job = tuple[Popen[bytes], PurePosixPath, RunnerHost, Sequence[str]]


def stop_jobs(site: Site, key: Path | None, jobs: list[Job]) -> None:
    """Close each job's SSH and have its host stop the job and remove the job's directory."""
    stoppers = []
    for worker, remote, host, options in jobs:
        worker.kill()
        argv = ssh_argv(site, host, key, cancel_command(remote), options)
        stoppers.append(Popen(argv, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL))
    for stopper in stoppers:
        try:
            stopper.wait(timeout=30)
        except TimeoutExpired:
            stopper.kill()
