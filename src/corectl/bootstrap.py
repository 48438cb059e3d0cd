"""bootstrap: first contact with fresh nodes over SSH (paramiko), before Ansible can reach them.

For each node: read its host key and show its fingerprint; record it in the site's known_hosts
once accepted (a key that differs from a recorded one is refused); log in with a password or an
existing key (as root, or as an admin user with sudo); install corectl's public key for the
cluster's SSH user; make sure python3 is present. Running it again changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import select
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko
from rich.console import Console
from rich.table import Table

from corectl import hostlist
from corectl.errors import CorectlError
from corectl.files import atomic_write
from corectl.site import Site
from corectl.site.context import Context
from corectl.site.model import Cluster, Node

CONNECT_TIMEOUT = 15.0
# paramiko's transport thread logs each failed handshake with a traceback; the error that
# reaches corectl says the same in one line
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class Login:
    user: str
    password: str | None = None
    key_file: Path | None = None


@dataclass(frozen=True)
class Outcome:
    node: str
    fingerprint: str
    new_host_key: bool
    key_installed: bool
    python_installed: bool


def endpoint(node: Node) -> str:
    """How OpenSSH's known_hosts names the endpoint."""
    return node.ssh_host if node.ssh_port == 22 else f"[{node.ssh_host}]:{node.ssh_port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_key(known_hosts: Path, name: str) -> tuple[str, str] | None:
    if not known_hosts.is_file():
        return None
    for line in known_hosts.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 3 and name in parts[0].split(","):
            return parts[1], parts[2]
    return None


def record_key(known_hosts: Path, name: str, key: paramiko.PKey) -> None:
    lines = known_hosts.read_text(encoding="utf-8").splitlines() if known_hosts.is_file() else []
    lines = [line for line in lines if not (line.split() and name in line.split()[0].split(","))]
    lines.append(f"{name} {key.get_name()} {key.get_base64()}")
    atomic_write(known_hosts, ("\n".join(lines) + "\n").encode(), 0o600)


def key_path(site: Site, cluster: Cluster, needed_for: str) -> Path:
    """cluster.ssh.key as a path (relative paths are relative to the site directory)."""
    key = cluster.config.cluster.ssh.key
    if not key:
        raise CorectlError(f"cluster.ssh.key is not set in cluster.yml: {needed_for}", exit_code=2)
    path = Path(key).expanduser()
    return path if path.is_absolute() else site.directory / path


def public_key(site: Site, cluster: Cluster) -> str:
    path = key_path(site, cluster, "bootstrap installs that key's .pub")
    pub = path.with_name(path.name + ".pub")
    if not pub.is_file():
        raise CorectlError(f"{pub}: missing (bootstrap installs corectl's public key from there)", exit_code=2)
    return pub.read_text(encoding="utf-8").strip()


def _script(pub: str, target_user: str) -> str:
    home = "/root" if target_user == "root" else f"$(getent passwd {shlex.quote(target_user)} | cut -d: -f6)"
    key = shlex.quote(pub)
    return (
        "set -e; "
        f'home={home}; install -d -m 0700 -o {shlex.quote(target_user)} "$home/.ssh"; '
        f'if grep -qxF {key} "$home/.ssh/authorized_keys" 2>/dev/null; then echo key=kept; '
        f'else echo {key} >> "$home/.ssh/authorized_keys"; echo key=added; fi; '
        f'chown {shlex.quote(target_user)} "$home/.ssh/authorized_keys"; chmod 0600 "$home/.ssh/authorized_keys"; '
        "if command -v python3 >/dev/null; then echo python=kept; "
        "else (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 || "
        "dnf -y -q install python3) >/dev/null; echo python=added; fi"
    )


def _run(client: paramiko.SSHClient, login: Login, script: str) -> str:
    command = f"sh -c {shlex.quote(script)}"
    if login.user != "root":
        command = f"sudo -S -p '' {command}"
    stdin, stdout, stderr = client.exec_command(command, timeout=600)
    if login.user != "root":
        stdin.write((login.password or "") + "\n")
        stdin.flush()
    out = stdout.read().decode(errors="replace")
    if stdout.channel.recv_exit_status() != 0:
        detail = stderr.read().decode(errors="replace").strip().splitlines()
        raise CorectlError(f"the bootstrap script failed: {detail[-1] if detail else out.strip()}")
    return out


class JumpCommand(paramiko.ProxyCommand):
    """The `ssh -W` to the node through its jump host, as paramiko's socket. paramiko's own ProxyCommand keeps
    reading after that ssh has ended (an unreachable jump host, a refused login) until its timeout, a core busy all
    the while (15 CPU-seconds per node); this one fails at the end of ssh's output, or at a write after ssh ended,
    with what ssh said."""

    def send(self, content: bytes) -> int:
        try:
            self.process.stdin.write(content)
        except OSError:  # (ssh ended before paramiko's first words: a broken pipe)
            raise self._ended() from None
        return len(content)

    def recv(self, size: int) -> bytes:
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError("no answer through the jump host")
        data = os.read(self.process.stdout.fileno(), size)
        if not data:
            raise self._ended()
        return data

    def close(self) -> None:
        if self.process.poll() is None:  # (paramiko's signals a process that may be gone already)
            self.process.terminate()

    def _ended(self) -> paramiko.ProxyCommandFailure:
        return paramiko.ProxyCommandFailure(" ".join(self.cmd), self._said())

    def _said(self) -> str:
        """ssh's last words on stderr (it has ended: its stdout is closed)."""
        try:
            self.process.wait(timeout=CONNECT_TIMEOUT)
            said = self.process.stderr.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError, subprocess.TimeoutExpired):
            said = []
        return said[-1] if said else f"ssh ended (exit status {self.process.returncode})"


def _channel(node: Node) -> JumpCommand | tuple[str, int]:
    """How to reach the node's sshd: directly, or through its jump host (cluster.yml jump_host,
    as Ansible's ProxyJump does; the jump host's key is checked by the operator's ssh config)."""
    if not node.jump_host:
        return (node.ssh_host, node.ssh_port)
    target = f"[{node.ssh_host}]" if ":" in node.ssh_host else node.ssh_host
    *hops, last = node.jump_host.split(",")
    command = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT:.0f}"]
    if hops:
        command += ["-J", ",".join(hops)]
    return JumpCommand(shlex.join([*command, "-W", f"{target}:{node.ssh_port}", f"ssh://{last}"]))


def bootstrap_node(
    site: Site, node: Node, login: Login, pub: str, target_user: str, accept: Callable[[str, str], bool]
) -> Outcome:
    name = endpoint(node)
    try:
        transport = paramiko.Transport(_channel(node))
        transport.start_client(timeout=CONNECT_TIMEOUT)
        server_key = transport.get_remote_server_key()
        transport.close()
    except (OSError, paramiko.SSHException) as exc:  # (ProxyCommandFailure: the jump host's ssh ended, its words)
        via = f" through jump host {node.jump_host}" if node.jump_host else ""
        said = exc.error if isinstance(exc, paramiko.ProxyCommandFailure) else exc
        raise CorectlError(f"{node.name}: cannot reach {name}{via}: {said}") from None
    shown = f"{server_key.get_name()} {fingerprint(server_key)}"
    recorded = known_key(site.known_hosts, name)
    new = recorded is None
    if recorded is not None and recorded != (server_key.get_name(), server_key.get_base64()):
        raise CorectlError(
            f"{node.name}: the host key of {name} ({shown}) differs from the one in {site.known_hosts}; "
            "refusing to connect (remove the old entry only if the node was reinstalled)"
        )
    if new and not accept(node.name, shown):
        raise CorectlError(f"{node.name}: host key {shown} not accepted; nothing done")
    client = paramiko.SSHClient()
    client.get_host_keys().add(name, server_key.get_name(), server_key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            node.ssh_host,
            port=node.ssh_port,
            username=login.user,
            password=login.password,
            key_filename=str(login.key_file) if login.key_file else None,
            look_for_keys=False,
            allow_agent=False,
            timeout=CONNECT_TIMEOUT,
            sock=_channel(node) if node.jump_host else None,
        )
        out = _run(client, login, _script(pub, target_user))
    except paramiko.AuthenticationException:
        raise CorectlError(f"{node.name}: login as {login.user} refused (password or key)") from None
    except (OSError, paramiko.SSHException) as exc:
        raise CorectlError(f"{node.name}: {exc}") from None
    finally:
        client.close()
    if new:
        record_key(site.known_hosts, name, server_key)
    return Outcome(node.name, shown, new, "key=added" in out, "python=added" in out)


def bootstrap_nodes(
    ctx: Context, console: Console, nodes: list[str], login: Login, accept: Callable[[str, str], bool]
) -> list[Outcome]:
    """Bootstrap ``nodes`` (host lists; none: every node of the site), then print one row per node."""
    site, cluster = ctx.site, ctx.rendered()
    try:
        wanted = [name for expr in nodes for name in hostlist.expand(expr)] or [n.name for n in cluster.nodes]
    except hostlist.HostlistError as exc:
        raise CorectlError(f"NODE: {exc}", exit_code=2) from None
    known = {n.name for n in cluster.nodes}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise CorectlError(f"not nodes of site {site.name}: {', '.join(unknown)}", exit_code=2)
    pub = public_key(site, cluster)
    target = cluster.config.cluster.ssh.user
    outcomes = []
    for name in wanted:
        node = cluster.node(name)
        outcomes.append(bootstrap_node(site, node, login, pub, node.ssh_user or target, accept))
    table = Table(title=f"bootstrap {site.name}")
    for column in ("node", "host key", "key recorded", "corectl key", "python3"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(
            o.node,
            o.fingerprint,
            "new" if o.new_host_key else "known",
            "installed" if o.key_installed else "present",
            "installed" if o.python_installed else "present",
        )
    console.print(table)
    return outcomes
