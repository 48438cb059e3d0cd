"""Site secrets: generated here on the control host, stored ansible-vault encrypted with the site.

inventories/<site>/secrets/munge.key    1024 random bytes (vault-encrypted, binary)
inventories/<site>/secrets/secrets.yml  vault-encrypted YAML of generated passwords (and the backup host's
                                        SSH key, when cluster.yml's backup names one)

The vault password comes from CORECTL_VAULT_PASSWORD_FILE, or CORECTL_VAULT_PASSWORD, or the
site's .vault-pass file (git-ignored; created by `corectl secrets init` when none is given).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets as random
import shutil
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from corectl.errors import CorectlError
from corectl.files import atomic_write
from corectl.site import Site

if TYPE_CHECKING:
    from corectl.site.model import ClusterConfig

MUNGE_KEY_BYTES = 1024
PASSWORD_MIN = 24
# name in secrets.yml -> what it is for
PASSWORDS = {"corectl_slurm_db_password": "slurmdbd's MariaDB user"}
PLACEHOLDERS = {"", "changeme", "change-me", "password", "secret", "todo", "xxx", "placeholder"}


@dataclass(frozen=True)
class SecretFiles:
    site: Site

    @property
    def directory(self) -> Path:
        return self.site.directory / "secrets"

    @property
    def munge_key(self) -> Path:
        return self.directory / "munge.key"

    @property
    def variables(self) -> Path:
        return self.directory / "secrets.yml"

    @property
    def default_password_file(self) -> Path:
        return self.site.directory / ".vault-pass"


def _vault(password: bytes):  # noqa: ANN202 - ansible's VaultLib
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(password))])


def vault_password(files: SecretFiles, create: bool = False) -> bytes:
    env_file = os.environ.get("CORECTL_VAULT_PASSWORD_FILE")
    if env_file:
        path = Path(env_file).expanduser()
        if not path.is_file():
            raise CorectlError(f"CORECTL_VAULT_PASSWORD_FILE={env_file}: no such file")
        return path.read_bytes().strip()
    env_password = os.environ.get("CORECTL_VAULT_PASSWORD")
    if env_password:
        return env_password.encode()
    path = files.default_password_file
    if path.is_file():
        return path.read_bytes().strip()
    if not create:
        raise CorectlError(
            f"no vault password: set CORECTL_VAULT_PASSWORD_FILE or CORECTL_VAULT_PASSWORD, or create {path}"
        )
    password = random.token_urlsafe(32).encode()
    atomic_write(path, password + b"\n", 0o600)
    return password


def _decrypt(files: SecretFiles, path: Path, password: bytes) -> bytes:
    from ansible.errors import AnsibleError

    if not path.is_file():
        raise CorectlError(f"{path}: missing; run corectl secrets init --inventory {files.site.name}")
    try:
        return _vault(password).decrypt(path.read_bytes())
    except AnsibleError as exc:
        raise CorectlError(f"{path}: cannot decrypt with the vault password ({str(exc).splitlines()[0]})") from None


def _write_encrypted(path: Path, data: bytes, password: bytes) -> None:
    atomic_write(path, _vault(password).encrypt(data), 0o600)


def read_values(site: Site) -> dict[str, Any]:
    """The decrypted secrets.yml ({} when it does not exist yet)."""
    files = SecretFiles(site)
    if not files.variables.is_file():
        return {}
    return yaml.safe_load(_decrypt(files, files.variables, vault_password(files))) or {}


def init(site: Site) -> list[str]:
    """Create whatever secret is missing; never replace an existing one. Returns what was made."""
    files = SecretFiles(site)
    password = vault_password(files, create=True)
    made: list[str] = []
    if not files.munge_key.is_file():
        _write_encrypted(files.munge_key, os.urandom(MUNGE_KEY_BYTES), password)
        made.append(str(files.munge_key))
    values = read_values(site)
    missing = [name for name in PASSWORDS if name not in values]
    for name in missing:
        values[name] = random.token_urlsafe(32)
    if backup_host_declared(site) and BACKUP_SSH_KEY not in values:
        values[BACKUP_SSH_KEY] = _new_ssh_key()
        missing.append(BACKUP_SSH_KEY)
    if grafana_declared(site) and GRAFANA_PASSWORD not in values:
        values[GRAFANA_PASSWORD] = random.token_urlsafe(32)
        missing.append(GRAFANA_PASSWORD)
    if missing:
        _write_encrypted(files.variables, yaml.safe_dump(values, sort_keys=True).encode(), password)
        made.extend(f"{files.variables}:{name}" for name in missing)
    return made


BACKUP_SSH_KEY = "corectl_backup_ssh_key"
GRAFANA_PASSWORD = "corectl_grafana_admin_password"


def grafana_declared(site: Site) -> bool:
    """Whether corectl installs Grafana (monitoring.grafana, install true; a site without its cluster.yml yet has
    none): its admin password is then corectl's to make."""
    config = _site_config(site)
    return config is not None and config.monitoring.grafana is not None and config.monitoring.grafana.install


def _site_config(site: Site) -> ClusterConfig | None:
    """cluster.yml's settings, or None for a site without its cluster.yml yet (secrets may come first)."""
    from corectl.site.loader import load_cluster

    return load_cluster(site.directory).config if site.cluster_file.is_file() else None


def _new_ssh_key() -> str:
    """A new ed25519 private key in OpenSSH's format."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    encoding, fmt = serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH
    return key.private_bytes(encoding, fmt, serialization.NoEncryption()).decode()


def backup_host_declared(site: Site) -> bool:
    """Whether cluster.yml names a backup host (a site without its cluster.yml yet names none)."""
    config = _site_config(site)
    return config is not None and config.backup is not None and config.backup.ssh is not None


def backup_public_key(site: Site) -> str:
    """The public half of the site's backup key, for the backup host's authorized_keys."""
    from cryptography.hazmat.primitives import serialization

    stored = str(read_values(site).get(BACKUP_SSH_KEY, ""))
    if not stored:
        raise CorectlError(
            f"site {site.name} has no backup key (cluster.yml backup.ssh names no backup host, or corectl secrets "
            f"init --inventory {site.name} has not run since)"
        )
    key = serialization.load_ssh_private_key(stored.encode(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{public.decode()} corectl-backup@{site.name}"


CEPH_KEYS = "corectl_cephfs_client_keys"
CEPH_KEY = re.compile(r"^AQ[A-Za-z0-9+/]{36}==$")

# What a compute node's own plays use (node-local runs, corectl.ansible.remote.nodelocal): of secrets.yml only
# these names. The munge key travels too; the DB password, the backup key, Grafana's password, the alert
# webhooks and the BMC credentials are the service nodes' or the control host's, never a compute node's.
NODE_SECRETS = (CEPH_KEYS,)


@dataclass(frozen=True)
class NodeSecrets:
    """A node-local job's secrets, vault-encrypted with a one-time password made for the run."""

    password: str  # never written anywhere: it travels in each job's stream only
    files: dict[str, bytes]  # name under inventory/site/secrets -> encrypted contents


def node_secrets(site: Site, clients: list[str]) -> NodeSecrets:
    """The munge key and the cephx keys of ``clients`` (the site's mounts), decrypted with the
    vault password and encrypted again with a fresh one-time password."""
    files = SecretFiles(site)
    password = vault_password(files)
    once = random.token_urlsafe(32)
    vault = _vault(once.encode())
    out = {files.munge_key.name: vault.encrypt(_decrypt(files, files.munge_key, password))}
    values = read_values(site)
    mine: dict[str, Any] = {}
    for name in NODE_SECRETS:
        if name in values:
            mine[name] = {c: k for c, k in dict(values[name]).items() if c in clients}
    out[files.variables.name] = vault.encrypt(yaml.safe_dump(mine, sort_keys=True).encode())
    return NodeSecrets(once, out)


def ceph_clients(site: Site) -> list[str]:
    """cephx client ids the site's CephFS mounts use (their keys come from the Ceph admins)."""
    from corectl.site.loader import load_cluster

    cephfs = load_cluster(site.directory).config.cephfs
    return sorted({m.client for m in cephfs.mounts}) if cephfs else []


def set_ceph_key(site: Site, client: str, key: str) -> None:
    """Store a cephx key (as `ceph auth get-key client.<id>` prints it) in secrets.yml."""
    key = key.strip()
    if not CEPH_KEY.match(key):
        raise CorectlError(f"the key for client.{client} is not a cephx key (ceph auth get-key client.{client})")
    files = SecretFiles(site)
    values = read_values(site)
    values.setdefault(CEPH_KEYS, {})[client] = key
    password = vault_password(files, create=True)  # a new site may store its Ceph keys first
    _write_encrypted(files.variables, yaml.safe_dump(values, sort_keys=True).encode(), password)


ALERT_WEBHOOKS = "corectl_alert_webhooks"
WEBHOOK_URL = re.compile(r"^https?://[^\s/?#@]+(/[^\s]*)?$")


def webhook_receivers(site: Site) -> list[str]:
    """The alert receivers declared with a webhook (its URL, usually holding a token, lives in the vault)."""
    from corectl.site.loader import load_cluster

    alerts = load_cluster(site.directory).config.monitoring.alerts
    return sorted(r.name for r in alerts.receivers if r.webhook) if alerts else []


def set_webhook(site: Site, receiver: str, url: str) -> None:
    """Store the URL an alert receiver's webhook posts to."""
    url = url.strip()
    declared = webhook_receivers(site)
    if receiver not in declared:
        raise CorectlError(
            f"'{receiver}' is not a receiver with webhook: true in monitoring.alerts (declared: "
            f"{', '.join(declared) or 'none'})",
            exit_code=2,
        )
    if not WEBHOOK_URL.match(url) or len(url) > 2048:
        raise CorectlError(f"the webhook for {receiver} is not an http(s) URL without user or spaces", exit_code=2)
    files = SecretFiles(site)
    values = read_values(site)
    values.setdefault(ALERT_WEBHOOKS, {})[receiver] = url
    password = vault_password(files, create=True)
    _write_encrypted(files.variables, yaml.safe_dump(values, sort_keys=True).encode(), password)


BMC_CREDENTIALS = "corectl_bmc_credentials"


def set_bmc_credentials(site: Site, user: str, password: str) -> None:
    """Store the user name and password corectl logs in to the nodes' BMCs with (one per site)."""
    if not re.fullmatch(r"[A-Za-z0-9._@-]{1,64}", user):
        raise CorectlError(f"BMC user '{user[:64]}': use letters, digits and . _ @ - (at most 64)", exit_code=2)
    if not password or "\n" in password:
        raise CorectlError("the BMC password is empty or has a line break", exit_code=2)
    files = SecretFiles(site)
    values = read_values(site)
    values[BMC_CREDENTIALS] = {"user": user, "password": password}
    password_bytes = vault_password(files, create=True)
    _write_encrypted(files.variables, yaml.safe_dump(values, sort_keys=True).encode(), password_bytes)


def bmc_credentials(site: Site) -> tuple[str, str]:
    """(user, password) for the nodes' BMCs, from the vault."""
    stored = read_values(site).get(BMC_CREDENTIALS) or {}
    user, password = str(stored.get("user", "")), str(stored.get("password", ""))
    if not user or not password:
        raise CorectlError(
            f"no BMC credentials for site {site.name}; store them with: "
            f"corectl secrets set-bmc --user USER --inventory {site.name} (the password on standard input)"
        )
    return user, password


def check(site: Site) -> None:
    """Refuse to run with a missing, unreadable, short or placeholder secret."""
    files = SecretFiles(site)
    password = vault_password(files)
    key = _decrypt(files, files.munge_key, password)
    if len(key) != MUNGE_KEY_BYTES or len(set(key)) < 64:
        raise CorectlError(f"{files.munge_key}: not {MUNGE_KEY_BYTES} random bytes; remove it and run secrets init")
    try:
        values = yaml.safe_load(_decrypt(files, files.variables, password)) or {}
    except yaml.YAMLError:
        raise CorectlError(f"{files.variables}: not valid YAML after decryption") from None
    for name, purpose in PASSWORDS.items():
        value = str(values.get(name, ""))
        if value.strip().lower() in PLACEHOLDERS or len(value) < PASSWORD_MIN:
            raise CorectlError(
                f"{files.variables}: {name} ({purpose}) is missing, a placeholder or shorter than {PASSWORD_MIN}"
            )
    hooks = values.get(ALERT_WEBHOOKS) or {}
    for receiver in webhook_receivers(site):
        if not WEBHOOK_URL.match(str(hooks.get(receiver, ""))):
            raise CorectlError(
                f"{files.variables}: no webhook URL for alert receiver {receiver}; store it with: "
                f"corectl secrets set-webhook {receiver} --inventory {site.name} (the URL on standard input)"
            )
    if backup_host_declared(site) and "OPENSSH PRIVATE KEY" not in str(values.get(BACKUP_SSH_KEY, "")):
        raise CorectlError(
            f"{files.variables}: no SSH key for the backup host (cluster.yml backup.ssh); make it with: "
            f"corectl secrets init --inventory {site.name}"
        )
    grafana = str(values.get(GRAFANA_PASSWORD, ""))
    if grafana_declared(site) and (grafana.strip().lower() in PLACEHOLDERS or len(grafana) < PASSWORD_MIN):
        raise CorectlError(
            f"{files.variables}: {GRAFANA_PASSWORD} (Grafana's admin user, cluster.yml monitoring.grafana) is missing, "
            f"a placeholder or shorter than {PASSWORD_MIN}; make it with: corectl secrets init --inventory {site.name}"
        )
    keys = values.get(CEPH_KEYS) or {}
    for client in ceph_clients(site):
        if not CEPH_KEY.match(str(keys.get(client, ""))):
            raise CorectlError(
                f"{files.variables}: no cephx key for client.{client} (used by cephfs mounts); "
                f"store it with: ceph auth get-key client.{client} | corectl secrets set-ceph-key {client} "
                f"--inventory {site.name}"
            )


VAULT_CLIENT = """#!{python}
# corectl's vault password script for one run: asks the corectl process that started the run.
import socket
import sys

client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.connect({socket!r})
data = b""
while chunk := client.recv(4096):
    data += chunk
sys.stdout.buffer.write(data)
"""


@contextmanager
def vault_password_client(site: Site, private_dir: Path) -> Iterator[Path]:
    """A vault password script that hands ansible the password for the length of one run.

    The script holds no secret: it asks this process over a Unix socket (owner only, peer
    checked), and a thread answers each connection with the password. Nothing is written to a
    disk, and once the run ends (or corectl is killed) there is nobody left to answer.
    """
    password = vault_password(SecretFiles(site)) + b"\n"
    own_dir = None
    if len(str(private_dir / "vault.sock")) > 100:  # AF_UNIX paths are short
        own_dir = Path(tempfile.mkdtemp(prefix="corectl-", dir="/tmp"))
    path = (own_dir or private_dir) / "vault.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        server.bind(str(path))
    finally:
        os.umask(old_umask)
    server.listen(16)
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                _pid, uid, _gid = struct.unpack("3i", creds)
                if uid == os.getuid():
                    with contextlib.suppress(OSError):
                        conn.sendall(password)

    thread = threading.Thread(target=serve, name="vault-pass", daemon=True)
    thread.start()
    script = private_dir / "vault-pass"
    script.write_text(VAULT_CLIENT.format(python=sys.executable, socket=str(path)), encoding="utf-8")
    script.chmod(0o700)
    try:
        yield script
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()
        path.unlink(missing_ok=True)
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
