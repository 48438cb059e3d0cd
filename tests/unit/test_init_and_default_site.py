"""Issue 14: the default site (--inventory, else CORECTL_INVENTORY, else the only site besides
the lab) and `corectl init SITE` (a commented cluster.yml that validates, group_vars/, secrets)."""

from __future__ import annotations

import shutil
from pathlib import Path

import paramiko
import pytest
import yaml
from typer.testing import CliRunner

from conftest import ROOT, closed_port
from corectl import bootstrap, secrets
from corectl.cli import app
from corectl.errors import CorectlError
from corectl.lab.inventory import cluster_text
from corectl.lab.spec import LabSpec
from corectl.site import Site, default_site_name, resolve_site
from corectl.site.loader import load_cluster


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with the prod site, as a fresh clone has it, and the lab's as `corectl lab up` writes it."""
    root = tmp_path / "project"
    (root / "playbooks").mkdir(parents=True)
    (root / "playbooks" / "site.yml").write_text("[]\n")
    (root / "roles").mkdir()
    (root / "inventories" / "prod").mkdir(parents=True)
    shutil.copy(ROOT / "inventories" / "prod" / "cluster.yml", root / "inventories" / "prod" / "cluster.yml")
    (root / "inventories" / "lab").mkdir()
    lab = Site(root=root, directory=root / "inventories" / "lab")
    (root / "inventories" / "lab" / "cluster.yml").write_text(cluster_text(LabSpec(site=lab)))
    monkeypatch.setenv("CORECTL_ROOT", str(root))
    monkeypatch.delenv("CORECTL_INVENTORY", raising=False)
    for name in ("CORECTL_VAULT_PASSWORD", "CORECTL_VAULT_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    return root


def test_the_only_site_besides_the_lab_is_the_default(project: Path):
    assert default_site_name(project, {}) == "prod"
    assert resolve_site(None, root=project).directory == project / "inventories" / "prod"
    result = CliRunner().invoke(app, ["validate"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("prod: cluster.yml is valid (13 nodes)")


def test_corectl_inventory_then_the_option_win(project: Path, monkeypatch: pytest.MonkeyPatch):
    assert default_site_name(project, {"CORECTL_INVENTORY": "lab"}) == "lab"
    monkeypatch.setenv("CORECTL_INVENTORY", "lab")
    assert CliRunner().invoke(app, ["validate"]).output.startswith("lab: ")
    assert CliRunner().invoke(app, ["validate", "--inventory", "prod"]).output.startswith("prod: ")


def test_two_sites_and_no_name_is_one_clear_line(project: Path):
    (project / "inventories" / "west").mkdir()
    shutil.copy(project / "inventories" / "prod" / "cluster.yml", project / "inventories" / "west" / "cluster.yml")
    (project / "inventories" / "scratch").mkdir()  # no cluster.yml: not a site
    with pytest.raises(CorectlError) as refused:
        default_site_name(project, {})
    assert "sites under" in str(refused.value) and "prod, west" in str(refused.value)
    result = CliRunner().invoke(app, ["provision"])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: which site? ") and "--inventory NAME or CORECTL_INVENTORY=NAME" in line


def test_no_site_at_all_points_to_init(project: Path):
    shutil.rmtree(project / "inventories" / "prod")
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 2
    assert "no site under" in result.output and "corectl init NAME" in result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["bootstrap", "--inventory", "nosuch"],
        ["add-node", "dgx99", "--inventory", "nosuch", "--address", "10.0.0.99", "--profile", "dgx-h100",
         "--bootstrap-user", "admin"],
    ],
    ids=["bootstrap", "add-node"],
)  # fmt: skip
def test_a_command_that_asks_for_a_password_names_a_missing_site_before_asking(
    project: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
):
    def asked(prompt: str) -> str:
        raise AssertionError(f"asked for a password: {prompt}")

    monkeypatch.setattr("getpass.getpass", asked)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: {project / 'inventories' / 'nosuch' / 'cluster.yml'}: not found (no site 'nosuch')"
    ]


def test_init_writes_a_site_that_validates_renders_and_has_its_secrets(project: Path):
    result = CliRunner().invoke(app, ["init", "west"])
    assert result.exit_code == 0, result.output
    site = resolve_site("west", root=project)
    cluster = load_cluster(site.directory)
    assert cluster.config.cluster.name == "west"
    assert [n.name for n in cluster.nodes] == ["dgx01", "dgx02", "dgx03", "dgx04", "head01"]
    assert "# " in site.cluster_file.read_text()  # commented for the operator
    assert yaml.safe_load((site.directory / "group_vars" / "all.yml").read_text()) == {}
    secrets.check(site)  # munge key and DB password made, decrypt with the generated password
    assert (site.directory / ".vault-pass").stat().st_mode & 0o777 == 0o600
    assert "vault password: " in result.output and "next: edit " in result.output
    render = CliRunner().invoke(app, ["render", "--inventory", "west"])
    assert render.exit_code == 0, render.output


def test_init_never_overwrites_and_refuses_bad_names(project: Path):
    before = (project / "inventories" / "prod" / "cluster.yml").read_bytes()
    for name, words in (("prod", "exists already"), ("Bad", "lower-case"), ("lab", "corectl lab up"), ("../x", "")):
        result = CliRunner().invoke(app, ["init", name])
        assert result.exit_code == 2, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1 and words in result.output
    assert (project / "inventories" / "prod" / "cluster.yml").read_bytes() == before
    assert sorted(p.name for p in (project / "inventories").iterdir()) == ["lab", "prod"]


def test_bootstrap_goes_through_the_jump_host(project: Path):
    """A site behind a bastion: bootstrap's SSH goes through cluster.yml's jump host (as Ansible's
    ProxyJump does), never straight to the node's address."""
    node = load_cluster(project / "inventories" / "prod").node("dgx01")
    assert bootstrap._channel(node) == ("10.10.1.11", 22)
    chained = node.model_copy(update={"jump_host": "admin@bastion:2222,ops@[2001:db8::1]:22"})
    command = bootstrap._channel(chained).cmd
    assert command[command.index("-J") + 1] == "admin@bastion:2222"
    assert command[-3:] == ["-W", "10.10.1.11:22", "ssh://ops@[2001:db8::1]:22"]


def test_an_unreachable_jump_host_fails_at_once_with_what_ssh_said(project: Path):
    """Bootstrap through a jump host that refuses the connection ends with ssh's own words (paramiko's ProxyCommand
    kept reading after ssh had ended, one core busy until its 15 s timeout, and said only that no SSH banner came)."""
    site = resolve_site("prod", root=project)
    node = load_cluster(site.directory).node("dgx01")
    behind = node.model_copy(update={"jump_host": f"nobody@127.0.0.1:{closed_port()}"})
    with pytest.raises(CorectlError) as raised:
        login = bootstrap.Login("root", "not-sent")
        bootstrap.bootstrap_node(site, behind, login, "ssh-ed25519 AAAA", "root", lambda *_: True)
    message = str(raised.value)
    assert message.startswith(f"dgx01: cannot reach 10.10.1.11 through jump host {behind.jump_host}: ssh: ")
    assert message.endswith("Connection refused"), message


def test_the_jump_command_carries_bytes_both_ways_and_ends_with_its_command():
    """JumpCommand is paramiko's socket: what is sent comes back through `cat`; at the end of its output the next
    read fails, and after its end a write fails, naming what the command said last."""
    echo = bootstrap.JumpCommand("cat")
    echo.settimeout(5)
    assert echo.send(b"SSH-2.0-x\r\n") == 11
    received = b""
    while len(received) < 11:
        received += echo.recv(64)
    assert received == b"SSH-2.0-x\r\n"
    echo.close()
    said = bootstrap.JumpCommand("sh -c 'echo first >&2; echo channel 0: open failed >&2'")
    said.settimeout(5)
    with pytest.raises(paramiko.ProxyCommandFailure) as raised:
        said.recv(64)
    assert raised.value.error == "channel 0: open failed"
    said.close()
    # ssh gone before paramiko's first words (its banner): the write fails the same way, not with a broken pipe
    gone = bootstrap.JumpCommand("sh -c 'echo connect to host: Connection refused >&2'")
    gone.process.wait(timeout=5)
    with pytest.raises(paramiko.ProxyCommandFailure) as raised:
        for _ in range(64):  # (the pipe's buffer may take the first writes)
            gone.send(b"SSH-2.0-x\r\n" * 1024)
    assert raised.value.error == "connect to host: Connection refused"
    gone.close()
