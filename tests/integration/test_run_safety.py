"""A real ansible-runner run on this machine (localhost, local connection): what it keeps, how it stops.

Issue 13: no secret at rest outside the vault (the vault password reaches Ansible through a script
that asks corectl over a socket; corectl's environment is allow-listed before ansible-runner
records it), SIGTERM and SIGHUP end a run like Ctrl-C (canceled, recorded, private directory
removed), and pruning never removes a run still in progress.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, probe_project
from corectl import secrets, store
from corectl.ansible import records, runner
from corectl.site import Site

VAULT_PASSWORD = "vault-pw-8c1e5d0f-at-rest-nowhere"
BOOTSTRAP_PASSWORD = "bootstrap-pw-4b7a9e21-at-rest-nowhere"

PROBE = """\
- name: Probe
  hosts: all
  gather_facts: false
  tasks:
    - name: Use a vaulted secret
      ansible.builtin.copy:
        content: "{{ corectl_slurm_db_password }}"
        dest: "{{ probe_out }}"
        mode: "0600"
      no_log: true
    - name: Wait
      ansible.builtin.command: sleep {{ probe_sleep | default(0) }}
      changed_when: false
"""

# run in a child process, so that signals can be sent to it
CHILD = """\
import sys
from pathlib import Path
from corectl.ansible.runner import run_playbook
from corectl.ansible.events import RunRequest
from corectl.site import Site
site = Site(root=Path(sys.argv[1]), directory=Path(sys.argv[2]))
extra = {"probe_out": sys.argv[3], "probe_sleep": int(sys.argv[4])}
run = run_playbook(RunRequest(site=site, playbook="probe.yml", command="probe", extravars=extra))
print(run.status, run.rc, flush=True)
sys.exit(run.rc)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    """A project with one playbook and a site of one host (this machine), secrets made from an
    environment vault password, and a bootstrap password in the environment as an operator has it."""
    site = probe_project(tmp_path, PROBE)
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD", VAULT_PASSWORD)
    monkeypatch.setenv("LAB_BOOTSTRAP_PASSWORD", BOOTSTRAP_PASSWORD)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    secrets.init(site)
    return site


def kept_files(site: Site) -> list[Path]:
    return [p for d in (site.runs_dir, site.facts_dir) if d.exists() for p in d.rglob("*") if p.is_file()]


def test_a_run_keeps_no_secret_and_ansible_still_gets_the_vault(project: Site, tmp_path: Path):
    out = tmp_path / "probe.out"
    run = runner.run_playbook(
        runner.RunRequest(site=project, playbook="probe.yml", command="probe", extravars={"probe_out": str(out)})
    )
    assert run.ok, run.output_tail()
    db_password = secrets.read_values(project)["corectl_slurm_db_password"]
    assert out.read_text() == db_password  # ansible decrypted secrets.yml with the piped password
    command = json.loads((run.artifact_dir / "command").read_text())
    assert "CORECTL_VAULT_PASSWORD" not in command["env"]
    assert "LAB_BOOTSTRAP_PASSWORD" not in command["env"]
    assert command["env"]["ANSIBLE_VAULT_PASSWORD_FILE"].endswith("/vault-pass")
    files = kept_files(project)
    assert len(files) >= 5
    for path in files:
        data = path.read_bytes()
        for secret in (VAULT_PASSWORD, BOOTSTRAP_PASSWORD, db_password):
            assert secret.encode() not in data, f"{secret[:12]}... in {path}"
    # the private directory with the vault script is gone
    assert not list((tmp_path / "tmp").glob("corectl-run-*"))
    # and corectl's own environment is whole again after the run
    assert os.environ["CORECTL_VAULT_PASSWORD"] == VAULT_PASSWORD


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_cancels_the_run_like_ctrl_c(project: Site, tmp_path: Path, signum: int):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-c", CHILD, str(project.root), str(project.directory), str(tmp_path / "o"), "120"]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # wait until the sleep task has started
            started = [p for p in project.runs_dir.glob("*/job_events/*.json") if '"task": "Wait"' in p.read_text()]
            if started:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the probe never reached its Wait task")
        child.send_signal(signum)
        out, err = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signum, (out, err)
    assert "Traceback" not in err
    if signum == signal.SIGTERM:
        assert out.split() == ["canceled", str(128 + signum)]
    records = [json.loads(p.read_text()) for p in project.runs_dir.glob("*/corectl.json")]
    assert [(r["status"], r["rc"]) for r in records] == [("canceled", 128 + signum)]
    assert not list((tmp_path / "tmp").glob("corectl-run-*"))  # the vault script's directory removed
    assert_nothing_left(str(tmp_path / "tmp"))  # ansible-playbook and its sleep task stopped too


# Waits below are for states (a task started, a process gone); their bounds only end a wait that failed, and are
# generous: the unit lane runs beside two labs, and a run that is slow there is not a broken one.
def assert_nothing_left(private: str, seconds: float = 90) -> None:
    """No process of the run (its private directory is in ansible-playbook's arguments and in the
    environment of its tasks) is left a little after corectl ended."""
    deadline = time.monotonic() + seconds
    while (survivors := _processes_mentioning(private)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert survivors == []


@pytest.mark.parametrize("accelerator", ["none", "mitogen"])
def test_sigkill_leaves_no_secret_behind(project: Site, tmp_path: Path, accelerator: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CORECTL_ACCELERATOR": accelerator}
    argv = [sys.executable, "-c", CHILD, str(project.root), str(project.directory), str(tmp_path / "o"), "120"]
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "o").exists() and time.monotonic() < deadline:  # the vaulted secret was used
            time.sleep(0.2)
        assert (tmp_path / "o").exists()
    finally:
        child.kill()
        child.wait(timeout=30)
    # ansible-playbook (started on a pty with SIGHUP ignored) and its task went down with corectl
    assert_nothing_left(str(tmp_path / "tmp"))
    left = [path for path in (tmp_path / "tmp").rglob("*") if path.is_file()]
    assert left, "the killed run's private directory is expected to stay behind"
    for path in left:
        assert VAULT_PASSWORD.encode() not in path.read_bytes(), path
    [script] = [path for path in left if path.name == "vault-pass"]
    assert subprocess.run([str(script)], capture_output=True, check=False).returncode != 0  # nobody answers


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of this user's processes that mention ``text`` (the run's private dir is in
    ansible-playbook's arguments and in the environment of its workers' tasks)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            blobs = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text.encode() in blobs and int(proc.name) != os.getpid():
            found.append(f"{proc.name} {cmdline}")
    return found


def test_prune_keeps_the_newest_and_never_a_run_in_progress(tmp_path: Path):
    site = Site(root=ROOT, directory=tmp_path)
    runs = site.runs_dir
    dead_pid = 2**22 + 17  # above pid_max on most machines: no such process
    finished = [runs / f"202611{day:02d}T000000Z-{dead_pid}" for day in range(1, 6)]
    for run in finished:
        run.mkdir(parents=True)
        (run / "corectl.json").write_text("{}")
    in_progress = runs / f"20261101T000000Z-{os.getpid()}"  # oldest of all, but its process is alive
    crashed = runs / f"20261101T000001Z-{dead_pid}"  # no record, process gone
    in_progress.mkdir()
    crashed.mkdir()
    (runs / "not-a-run").mkdir()
    for run in finished:
        store.add_run(site, run.name, {"command": "health", "started": run.name})
    removed = records.prune_runs(site, keep=3)
    assert sorted(removed) == sorted([crashed, *finished[:2]])
    assert [r["id"] for r in store.runs(site)] == [r.name for r in finished[2:]]  # the index forgot them too
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        [in_progress.name, "not-a-run", *(r.name for r in finished[2:])]
    )


def keygen(path: Path) -> None:
    """A new ed25519 key pair without a passphrase at path (and path.pub)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


class BootstrapPeer:
    """An SSH server on loopback for the add-node kill test, in a thread of this test process.

    It stands in for a fresh node's sshd only as far as the kill test needs: it shows a host key,
    accepts the bootstrap's password login and answers its script as a node that already had
    corectl's key and python3 would (the script's work on a real node is covered by the lab e2e), and
    refuses every public key, so Ansible's first connection fails as unreachable.
    """

    PASSWORD = "kill-test-peer-password"

    def __init__(self, key_file: Path) -> None:
        import socket
        import threading

        import paramiko

        keygen(key_file)
        self.key = paramiko.Ed25519Key.from_private_key_file(str(key_file))
        self.public = f"{self.key.get_name()} {self.key.get_base64()}"
        self.bootstrapped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: object) -> None:
        import threading

        import paramiko

        peer = self
        exec_requested = threading.Event()

        class Server(paramiko.ServerInterface):
            def get_allowed_auths(self, username: str) -> str:
                return "password,publickey"

            def check_auth_password(self, username: str, password: str) -> int:
                ok = username == "root" and password == peer.PASSWORD
                return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

            def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
                return paramiko.AUTH_FAILED

            def check_channel_request(self, kind: str, chanid: int) -> int:
                refused = paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
                return paramiko.OPEN_SUCCEEDED if kind == "session" else refused

            def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
                exec_requested.set()
                return command.startswith(b"sh -c ")

        transport = paramiko.Transport(conn)
        transport.add_server_key(self.key)
        try:
            transport.start_server(server=Server())
            channel = transport.accept(30)
            if channel is None or not exec_requested.wait(30):
                return
            self.bootstrapped += 1
            channel.sendall(b"key=kept\npython=kept\n")
            channel.send_exit_status(0)
            channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            transport.join(30)  # until the client has read the answer and hung up
            transport.close()


def test_add_node_killed_at_random_points_leaves_every_file_old_or_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """SIGKILL at random points of an add-node (validate, cluster.yml edit, render, secrets check,
    bootstrap, first playbook): cluster.yml, hosts.yml, nodes.json, switches.json, site.json, known_hosts and
    the secrets are each the old or the new file, never partial. The new node's SSH port is a loopback peer
    (BootstrapPeer) that lets the bootstrap in, so its host key is recorded, and refuses Ansible's key;
    the other nodes' ports are closed. Each run fails fast at its first playbook, after every file it
    writes has been written."""
    from corectl.lab.inventory import lab_cluster
    from corectl.lab.spec import LabSpec

    site = Site(root=ROOT, directory=tmp_path / "killsite")
    site.directory.mkdir()
    port = 1031  # nothing listens there: connection refused
    site.cluster_file.write_text(json.dumps(lab_cluster(LabSpec(site=site, computes=1, ssh_port_base=port))))
    monkeypatch.delenv("CORECTL_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD", VAULT_PASSWORD)
    secrets.init(site)
    corectl = str(Path(sys.executable).parent / "corectl")
    subprocess.run([corectl, "render", "--inventory", str(site.directory)], check=True, capture_output=True)
    nodes_file, switches_file, site_file = (site.directory / f for f in ("nodes.json", "switches.json", "site.json"))
    # known_hosts as a site has it after a few hundred nodes: large enough that a write takes a while
    lines = (f"[10.1.{i // 250}.{i % 250}]:22 ssh-ed25519 AAAA{i:060d}\n" for i in range(600))
    site.known_hosts.write_text("".join(lines))
    (site.directory / ".lab").mkdir()  # the key the bootstrap installs (cluster.yml's ssh key, as in the lab)
    keygen(site.directory / ".lab" / "id_ed25519")
    watched = [site.cluster_file, site.hosts_file, nodes_file, switches_file, site_file, site.known_hosts]
    watched += sorted((site.directory / "secrets").iterdir())
    old = {path: path.read_bytes() for path in watched}
    peer = BootstrapPeer(tmp_path / "peer_key")
    monkeypatch.setenv("KILL_TEST_PASSWORD", BootstrapPeer.PASSWORD)
    add = [corectl, "add-node", "dgx09", "--inventory", str(site.directory), "--address", "172.29.10.19"]
    add += ["--profile", "dgx-standin", "--leaf", "leaf1", "--ssh-host", "127.0.0.1", "--ssh-port", str(peer.port)]
    add += ["--bootstrap-user", "root", "--password-env", "KILL_TEST_PASSWORD", "--yes"]

    def restore() -> None:
        for path, data in old.items():
            path.write_bytes(data)

    started = time.monotonic()
    reference = subprocess.run(add, capture_output=True, text=True, check=False)
    whole = time.monotonic() - started
    assert reference.returncode != 0 and "Traceback" not in reference.stderr, reference.stderr
    assert "unreachable" in reference.stdout + reference.stderr or "failed on" in reference.stderr
    new = {path: path.read_bytes() for path in watched}
    assert new[site.cluster_file] != old[site.cluster_file] and new[site.hosts_file] != old[site.hosts_file]
    assert new[nodes_file] != old[nodes_file] and new[switches_file] != old[switches_file]  # dgx09 on leaf1
    assert new[site.known_hosts] == old[site.known_hosts] + f"[127.0.0.1]:{peer.port} {peer.public}\n".encode()
    assert peer.bootstrapped >= 1  # the bootstrap got in and ran its script before the playbook
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    # most kills in the first second or so, where the files are written; the rest anywhere
    delays = [rng.uniform(0.2, 1.2) for _ in range(4)] + [rng.uniform(0.2, whole) for _ in range(2)]
    print(f"\nadd-node took {whole:.1f} s; kill delays (seed {seed}): {', '.join(f'{d:.2f}' for d in delays)}")
    seen_new = seen_known = 0
    for delay in delays:
        restore()
        proc = subprocess.Popen(add, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=30)
        for path in watched:
            data = path.read_bytes()
            assert data in (old[path], new[path]), f"{path.name} is neither old nor new after a kill at {delay:.2f} s"
        seen_new += site.cluster_file.read_bytes() == new[site.cluster_file]
        seen_known += site.known_hosts.read_bytes() == new[site.known_hosts]
        leftovers = [p.name for p in site.directory.iterdir() if p.name.endswith(".tmp")]
        for name in leftovers:  # a kill between write and rename leaves the temporary file, never a mix
            (site.directory / name).unlink()
    print(f"{seen_new} of {len(delays)} kills came after the cluster.yml edit, {seen_known} after the host key's")
