"""Site secrets: generated once, vault-encrypted, checked before any node is touched."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from corectl import secrets
from corectl.errors import CorectlError
from corectl.lab.inventory import lab_cluster
from corectl.lab.spec import LabSpec
from corectl.site import Site


@pytest.fixture
def site(tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD", raising=False)
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD_FILE", raising=False)
    directory = tmp_path / "site"
    directory.mkdir()
    site = Site(root=root, directory=directory)
    # a lab without Ceph: no CephFS mounts, so no cephx keys needed
    (directory / "cluster.yml").write_text(yaml.safe_dump(lab_cluster(LabSpec(site=site, ceph=False))))
    return site


def test_init_generates_encrypted_secrets_once(site: Site):
    files = secrets.SecretFiles(site)
    made = secrets.init(site)
    assert len(made) == 3  # munge key; slurmdbd's and Grafana's passwords (the lab runs Grafana)
    assert files.munge_key.read_bytes().startswith(b"$ANSIBLE_VAULT;1.1;AES256")
    assert files.variables.read_bytes().startswith(b"$ANSIBLE_VAULT;1.1;AES256")
    assert oct(files.default_password_file.stat().st_mode & 0o777) == "0o600"
    key_before = files.munge_key.read_bytes()
    assert secrets.init(site) == []  # nothing replaced
    assert files.munge_key.read_bytes() == key_before
    secrets.check(site)
    password = secrets.vault_password(files)
    key = secrets._vault(password).decrypt(files.munge_key.read_bytes())
    assert len(key) == 1024
    values = yaml.safe_load(secrets._vault(password).decrypt(files.variables.read_bytes()))
    assert len(values["corectl_slurm_db_password"]) >= 24
    assert len(values["corectl_grafana_admin_password"]) >= 24


def test_grafanas_admin_password_is_made_only_for_a_site_that_runs_grafana(site: Site):
    cluster_yml = site.directory / "cluster.yml"
    config = yaml.safe_load(cluster_yml.read_text())
    config["monitoring"].pop("grafana")
    cluster_yml.write_text(yaml.safe_dump(config))
    secrets.init(site)
    assert secrets.GRAFANA_PASSWORD not in secrets.read_values(site)
    secrets.check(site)
    config["monitoring"]["grafana"] = {"install": False}  # the site's own Grafana: its password is the site's
    cluster_yml.write_text(yaml.safe_dump(config))
    assert secrets.init(site) == []
    secrets.check(site)
    config["monitoring"]["grafana"] = {"anonymous_viewers": False}
    cluster_yml.write_text(yaml.safe_dump(config))
    with pytest.raises(CorectlError, match=r"corectl_grafana_admin_password .* is missing.*corectl secrets init"):
        secrets.check(site)
    assert secrets.init(site) == [f"{secrets.SecretFiles(site).variables}:corectl_grafana_admin_password"]
    secrets.check(site)


def test_missing_secret_stops_the_run(site: Site):
    secrets.init(site)
    secrets.SecretFiles(site).munge_key.unlink()
    with pytest.raises(CorectlError, match=r"munge.key: missing; run corectl secrets init"):
        secrets.check(site)


def test_placeholder_password_is_refused(site: Site):
    secrets.init(site)
    files = secrets.SecretFiles(site)
    password = secrets.vault_password(files)
    secrets._write_encrypted(files.variables, b"corectl_slurm_db_password: changeme\n", password)
    with pytest.raises(CorectlError, match="placeholder"):
        secrets.check(site)


def test_wrong_vault_password_is_a_clean_error(site: Site, monkeypatch: pytest.MonkeyPatch):
    secrets.init(site)
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD", "not-the-password")
    with pytest.raises(CorectlError, match="cannot decrypt"):
        secrets.check(site)


def test_no_password_anywhere(site: Site):
    with pytest.raises(CorectlError, match="no vault password"):
        secrets.check(site)


def test_password_from_environment_file(site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pw = tmp_path / "pw"
    pw.write_text("from-a-file\n")
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD_FILE", str(pw))
    secrets.init(site)
    assert not secrets.SecretFiles(site).default_password_file.exists()
    secrets.check(site)


def test_provision_without_secrets_touches_no_node(prod_copy: Path, monkeypatch: pytest.MonkeyPatch):
    from typer.testing import CliRunner

    from corectl.cli import app

    monkeypatch.delenv("CORECTL_VAULT_PASSWORD", raising=False)
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD_FILE", raising=False)
    result = CliRunner().invoke(app, ["provision", "--inventory", str(prod_copy)])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no vault password")
    assert not (prod_copy / ".runs").exists()  # ansible never started


def test_runner_hands_ansible_the_vault(site: Site, tmp_path: Path):
    from corectl.ansible.events import RunRequest
    from corectl.ansible.runner import runner_kwargs

    secrets.init(site)
    private = tmp_path / "private"
    private.mkdir()
    with secrets.vault_password_client(site, private) as password_file:
        kwargs = runner_kwargs(RunRequest(site=site), private, password_file)
        assert kwargs["envvars"]["ANSIBLE_VAULT_PASSWORD_FILE"] == str(password_file)
        assert kwargs["cmdline"] == f"--extra-vars @{site.directory / 'secrets' / 'secrets.yml'}"
        # a script only its owner may run, which answers with the password (and holds none)
        assert oct(password_file.stat().st_mode & 0o777) == "0o700"
        password = secrets.vault_password(secrets.SecretFiles(site))
        assert password not in password_file.read_bytes()
        for _ in range(3):
            answer = subprocess.run([str(password_file)], capture_output=True, check=True).stdout
            assert answer == password + b"\n"
    # after the run nobody answers
    assert subprocess.run([str(password_file)], capture_output=True, check=False).returncode != 0


def test_cephfs_mounts_need_their_client_key(prod_copy: Path, root: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD", raising=False)
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD_FILE", raising=False)
    site = Site(root=root, directory=prod_copy)  # core declares cephfs mounts for client.corectl
    secrets.init(site)
    with pytest.raises(CorectlError, match=r"no cephx key for client.corectl"):
        secrets.check(site)
    with pytest.raises(CorectlError, match="not a cephx key"):
        secrets.set_ceph_key(site, "corectl", "changeme")
    secrets.set_ceph_key(site, "corectl", "AQAg7R9pAAAAABAAaxiE7mSdzWtv4z/2z7+3cQ==\n")
    secrets.check(site)


def test_an_alert_webhook_is_kept_in_the_vault(prod_copy: Path, root: Path, monkeypatch: pytest.MonkeyPatch):
    """A receiver with webhook: true needs its URL (a chat tool's, with its token) in the vault, not in cluster.yml."""
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD", raising=False)
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD_FILE", raising=False)
    cluster_yml = prod_copy / "cluster.yml"
    text = cluster_yml.read_text().replace(
        "      - {name: oncall, email: [hpc-oncall@example.org]}", "      - {name: oncall, webhook: true}"
    )
    cluster_yml.write_text(text)
    site = Site(root=root, directory=prod_copy)
    secrets.init(site)
    secrets.set_ceph_key(site, "corectl", "AQAg7R9pAAAAABAAaxiE7mSdzWtv4z/2z7+3cQ==\n")
    with pytest.raises(CorectlError, match=r"no webhook URL for alert receiver oncall; store it with: corectl secrets"):
        secrets.check(site)
    with pytest.raises(CorectlError, match=r"'operators' is not a receiver with webhook: true .*declared: oncall"):
        secrets.set_webhook(site, "operators", "https://chat.example.org/hooks/T1/B2/abc")
    with pytest.raises(CorectlError, match="not an http"):
        secrets.set_webhook(site, "oncall", "https://user:pw@chat.example.org/hook")
    url = "https://chat.example.org/hooks/T1/B2/tokenabc123"
    secrets.set_webhook(site, "oncall", url + "\n")
    secrets.check(site)
    assert secrets.read_values(site)[secrets.ALERT_WEBHOOKS] == {"oncall": url}
    assert b"tokenabc123" not in (prod_copy / "secrets" / "secrets.yml").read_bytes()
    assert "tokenabc123" not in cluster_yml.read_text()


def test_a_backup_host_gets_a_key_of_the_sites_own(site: Site):
    """backup.ssh: corectl makes the head's login key for the backup host, once, in the vault; its public half is
    what `corectl secrets backup-key` prints; check refuses a site that names a backup host without one."""
    secrets.init(site)
    assert secrets.BACKUP_SSH_KEY not in secrets.read_values(site)  # no backup host: no key
    with pytest.raises(CorectlError, match="has no backup key"):
        secrets.backup_public_key(site)
    cluster_yml = site.directory / "cluster.yml"
    config = yaml.safe_load(cluster_yml.read_text())
    host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE4cR7a1uZqk0mXbH2cQfEaR0w9yL2v9mHhC1k3j7a1b"
    config["backup"]["ssh"] = {"host": "backup01.example.org", "host_key": host_key}
    cluster_yml.write_text(yaml.safe_dump(config))
    with pytest.raises(CorectlError, match=r"no SSH key for the backup host .*corectl secrets init"):
        secrets.check(site)
    made = secrets.init(site)
    assert made == [f"{secrets.SecretFiles(site).variables}:corectl_backup_ssh_key"]
    secrets.check(site)
    private = secrets.read_values(site)[secrets.BACKUP_SSH_KEY]
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert private.splitlines()[4].encode() not in (site.directory / "secrets" / "secrets.yml").read_bytes()
    public = secrets.backup_public_key(site)
    assert public.startswith("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA") and public.endswith(f" corectl-backup@{site.name}")
    # ssh-keygen derives the same public key from the private one
    key_file = site.directory / "id"
    key_file.write_text(private)
    key_file.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key_file)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == public.split()[:2]
    assert secrets.init(site) == []  # made once
    assert secrets.read_values(site)[secrets.BACKUP_SSH_KEY] == private
