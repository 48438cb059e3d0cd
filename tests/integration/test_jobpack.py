"""A packed job through ansible-runner's transmit | worker | process (issue 15's building block).

The worker is a real `ansible-runner worker` process on this machine, as it would run on a runner
host behind SSH; the hosts are local. Nothing of Ansible or ansible-runner is mocked.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from ansible.parsing.vault import VaultLib, VaultSecret

from conftest import probe_project
from corectl.ansible.events import RunRequest
from corectl.ansible.remote.jobpack import RunnerSide, pack, run_streamed
from corectl.ansible.remote.stream import EVENTS, read_events
from corectl.site import Site

PROBE = """
- name: Probe
  hosts: all
  gather_facts: false
  tasks:
    - name: Report what the run was given
      ansible.builtin.debug:
        msg:
          check: "{{ ansible_check_mode }}"
          x: "{{ x | default('unset') }}"
          shared: "{{ corectl_probe_shared | default('unset') }}"
          layered: "{{ corectl_probe_layered | default('unset') }}"
          site_setting: "{{ corectl_probe_setting | default('unset') }}"
          secret_length: "{{ corectl_probe_secret | default('') | length }}"
      tags: [t1]
    - name: Fail where asked
      ansible.builtin.fail:
        msg: asked to fail
      when: probe_fail | default(false) | bool
      tags: [t1]
"""
PASSWORD = "test-only-vault-password"
SECRET = "test-only-secret-value-0123456789"


def probe_site(tmp_path: Path, root: Path) -> Site:
    """A project with the probe playbook and a site: layered group_vars, site.json, a vaulted secret."""
    site = probe_project(tmp_path, PROBE, ("a", "b"))
    (site.root / "group_vars" / "all.yml").write_text("corectl_probe_shared: project\ncorectl_probe_layered: project\n")
    (site.directory / "group_vars").mkdir()
    (site.directory / "group_vars" / "all.yml").write_text("corectl_probe_layered: site\n")
    site.site_file.write_text(json.dumps({"corectl_probe_setting": "from site.json"}))
    (site.directory / "secrets").mkdir()
    vault = VaultLib([("default", VaultSecret(PASSWORD.encode()))])
    plain = yaml.safe_dump({"corectl_probe_secret": SECRET}).encode()
    (site.directory / "secrets" / "secrets.yml").write_bytes(vault.encrypt(plain))
    return site


def run_probe(
    tmp_path: Path, site: Site, request: RunRequest, consume: bool = False
) -> tuple[str, int, list[dict], dict, Path]:
    worker_dir = tmp_path / "worker-side" / "job"  # what the worker will unpack into
    runner = RunnerSide(remote_dir=PurePosixPath(worker_dir), fact_cache=PurePosixPath(tmp_path / "runner-facts"))
    kwargs = pack(request, tmp_path / "packed", "probe-1", runner, PASSWORD)
    worker = [str(Path(sys.executable).parent / "ansible-runner"), "worker", "--private-data-dir", str(worker_dir),
              "--delete"]  # fmt: skip
    events: list[dict[str, Any]] = []
    done = run_streamed(kwargs, worker, tmp_path / "processed", events.append, consume=consume)
    return done.status, done.rc, events, kwargs, worker_dir


def reports(events: list[dict]) -> dict[str, dict]:
    return {
        e["event_data"]["host"]: e["event_data"]["res"]["msg"]
        for e in events
        if e["event"] == "runner_on_ok" and e["event_data"]["task"].startswith("Report")
    }


def test_a_packed_job_runs_through_a_worker_like_a_direct_run(tmp_path: Path, root: Path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    site = probe_site(tmp_path, root)
    request = RunRequest(site=site, playbook="probe.yml", command="probe", limit="a", tags="t1", check=True,
                         extravars={"x": 1})  # fmt: skip
    status, rc, events, kwargs, worker_dir = run_probe(tmp_path, site, request)

    assert (status, rc) == ("successful", 0), [e.get("stdout") for e in events][-5:]
    # --limit, --tags, --check, extra vars, shared group_vars under the site's, site.json, the secret
    assert reports(events) == {
        "a": {"check": True, "x": 1, "shared": "project", "layered": "site", "site_setting": "from site.json",
              "secret_length": len(SECRET)},
    }  # fmt: skip
    assert not worker_dir.exists()  # --delete: the worker's directory went with the job
    # the job names no path of the control host: only the worker's directory and the runner's cache
    named = [kwargs["fact_cache"], *shlex.split(kwargs["cmdline"]), *kwargs["envvars"].values()]
    paths = [part for value in named for part in shlex.split(str(value)) if "/" in part]
    control = str(tmp_path / "project")
    assert paths and not [p for p in paths if control in p], paths
    assert all(
        p.split("=")[-1].lstrip("@").startswith((str(worker_dir), str(tmp_path / "runner-facts"))) for p in paths
    ), paths
    # the secrets travel as at rest: the packed secrets.yml is still vault-encrypted
    packed = (tmp_path / "packed" / "inventory" / "site" / "secrets" / "secrets.yml").read_text()
    assert packed.startswith("$ANSIBLE_VAULT;") and SECRET not in packed
    # and nothing in the events shows the password or the secret
    assert PASSWORD not in json.dumps(events) and SECRET not in json.dumps(events)
    # the events kept are those handed on, in order, in the job's one file (issue 49: not a file per event)
    processed = tmp_path / "processed"
    assert [e["uuid"] for e in read_events(processed / EVENTS)] == [e["uuid"] for e in events]
    assert not list(processed.rglob("job_events/*.json"))
    assert (processed / "artifacts" / "rc").read_text().strip() == "0"  # the worker's own artifacts


def test_a_failing_packed_job_reports_its_hosts_and_leaves_nothing_on_the_worker(tmp_path: Path, root: Path,
                                                                               monkeypatch):  # fmt: skip
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    site = probe_site(tmp_path, root)
    request = RunRequest(site=site, playbook="probe.yml", command="probe", extravars={"probe_fail": True})
    status, rc, events, _, worker_dir = run_probe(tmp_path, site, request, consume=True)

    assert status == "failed" and rc != 0
    # consume: the pack on this host went as soon as it was sent (transmit writes the password into its env/)
    assert not (tmp_path / "packed").exists()
    failed = sorted(e["event_data"]["host"] for e in events if e["event"] == "runner_on_failed")
    assert failed == ["a", "b"]
    assert not worker_dir.exists()


def test_a_worker_that_never_runs_is_an_error_not_a_hang(tmp_path: Path, root: Path):
    """What a runner host that cannot be reached looks like: SSH exits 255 with nothing on stdout."""
    site = probe_site(tmp_path, root)
    runner = RunnerSide(remote_dir=PurePosixPath(tmp_path / "job"), fact_cache=PurePosixPath(tmp_path / "facts"))
    kwargs = pack(RunRequest(site=site, playbook="probe.yml"), tmp_path / "packed", "probe-2", runner, PASSWORD)
    events: list[dict[str, Any]] = []
    unreachable = ["sh", "-c", "echo 'ssh: connect to host runner1 port 22: No route to host' >&2; exit 255"]
    done = run_streamed(kwargs, unreachable, tmp_path / "processed", events.append)
    assert (done.status, done.rc, done.worker_rc) == ("error", 1, 255)
    assert done.said == ["ssh: connect to host runner1 port 22: No route to host"]
    assert events == []


def node_local_site(tmp_path: Path, root: Path, monkeypatch) -> tuple[Site, bytes]:
    """The probe site with a munge key, every kind of secret in secrets.yml and two nodes' host_vars."""
    site = probe_site(tmp_path, root)
    vault = VaultLib([("default", VaultSecret(PASSWORD.encode()))])
    munge = os.urandom(1024)
    (site.directory / "secrets" / "munge.key").write_bytes(vault.encrypt(munge))
    values = {
        "corectl_slurm_db_password": "db-password-0123456789abcdef",
        "corectl_grafana_admin_password": "grafana-password-0123456789",
        "corectl_bmc_credentials": {"user": "admin", "password": "bmc-password-0123456789"},
        "corectl_cephfs_client_keys": {"corectl": "AQ" + "A" * 36 + "==", "other": "AQ" + "B" * 36 + "=="},
        "corectl_probe_secret": SECRET,
    }
    (site.directory / "secrets" / "secrets.yml").write_bytes(vault.encrypt(yaml.safe_dump(values).encode()))
    (site.directory / "host_vars").mkdir()
    (site.directory / "host_vars" / "a.yml").write_text("x: a-only-value\n")
    (site.directory / "host_vars" / "b.yml").write_text("x: b-only-value\n")
    monkeypatch.setenv("CORECTL_VAULT_PASSWORD", PASSWORD)
    return site, munge


def node_local_job(tmp_path: Path, site: Site, remote: PurePosixPath) -> tuple[dict, list[bytes], Path]:
    """Node a's job as a node-local run makes it: the common part packed and zipped once, then a's own part."""
    from corectl.ansible.remote.jobpack import NodeJob, host_vars, zip_message
    from corectl.secrets import node_secrets

    mine = node_secrets(site, ["corectl"])
    side = RunnerSide(remote_dir=remote, fact_cache=PurePosixPath(tmp_path / "node-facts"))
    request = RunRequest(site=site, playbook="probe.yml", extravars={"ansible_connection": "local"})
    common = pack(request, tmp_path / "common", "x", side, mine.password, NodeJob("", mine.files))
    own = tmp_path / "own"
    own.mkdir()
    host_vars(site.directory, "a", own)
    return {**common, "private_data_dir": str(own), "limit": "a"}, [zip_message(tmp_path / "common")], own


def test_a_node_local_job_carries_only_that_nodes_secrets_under_a_one_time_password(
    tmp_path: Path, root: Path, monkeypatch
):
    """Issue 30: what a node receives, decoded from the very stream its worker reads (the common part zipped once,
    then its own) the way the worker reads it: its own host_vars, the munge key and the cephx key of the site's
    mount, encrypted with the run's one-time password; never the site's vault password, another node's host_vars
    or a secret of the service nodes or the control host."""
    from ansible_runner.utils.streaming import unstream_dir

    from corectl.ansible.remote.jobpack import send

    site, munge = node_local_site(tmp_path, root, monkeypatch)
    kwargs, layers, _ = node_local_job(tmp_path, site, PurePosixPath("/dev/shm/corectl-job-x"))
    with (tmp_path / "stream").open("wb") as stream:
        send(kwargs, layers, stream)
    unpacked = tmp_path / "unpacked"
    with (tmp_path / "stream").open("rb") as stream:  # ansible-runner's worker loop
        sent = json.loads(stream.readline())["kwargs"]
        while "eof" not in (message := json.loads(stream.readline())):
            unstream_dir(stream, message["zipfile"], str(unpacked))  # type: ignore[arg-type]
    received = (tmp_path / "stream").read_bytes() + b"".join(p.read_bytes() for p in unpacked.rglob("*") if p.is_file())
    never = [PASSWORD, "db-password-0123456789abcdef", "grafana-password-0123456789", "bmc-password-0123456789",
             "AQ" + "B" * 36 + "==", "b-only-value", SECRET]  # fmt: skip
    assert [needle for needle in never if needle.encode() in received] == []
    secrets_dir = unpacked / "inventory" / "site" / "secrets"
    assert sorted(p.name for p in secrets_dir.iterdir()) == ["munge.key", "secrets.yml"]
    assert sorted(p.name for p in (unpacked / "inventory" / "site" / "host_vars").iterdir()) == ["a.yml"]
    # what the node can read with the password it is given: the munge key and its mount's cephx key, nothing else
    [once] = json.loads((unpacked / "env" / "passwords").read_text()).values()
    assert once != PASSWORD
    opened = VaultLib([("default", VaultSecret(once.encode()))])
    assert opened.decrypt((secrets_dir / "munge.key").read_bytes()) == munge
    assert munge not in received  # in the job only encrypted
    assert yaml.safe_load(opened.decrypt((secrets_dir / "secrets.yml").read_bytes())) == {
        "corectl_cephfs_client_keys": {"corectl": "AQ" + "A" * 36 + "=="}
    }
    assert "--ask-vault-pass" in (unpacked / "env" / "cmdline").read_text()
    assert json.loads((unpacked / "env" / "extravars").read_text())["ansible_connection"] == "local"
    assert sent["limit"] == "a" and "passwords" not in sent


def test_a_node_local_job_runs_through_a_real_worker(tmp_path: Path, root: Path, monkeypatch):
    """The layered stream (common part, then the node's own) is one a real `ansible-runner worker` runs: the probe
    sees its host_vars, the extra vars and no secret of the site's (secrets.yml is the node's own)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    site, _ = node_local_site(tmp_path, root, monkeypatch)
    worker_dir = tmp_path / "worker-side" / "job"
    kwargs, layers, own = node_local_job(tmp_path, site, PurePosixPath(worker_dir))
    worker = [str(Path(sys.executable).parent / "ansible-runner"), "worker", "--private-data-dir", str(worker_dir),
              "--delete"]  # fmt: skip
    events: list[dict[str, Any]] = []
    done = run_streamed(kwargs, worker, tmp_path / "processed", events.append, consume=True, layers=layers)
    assert (done.status, done.rc) == ("successful", 0), [e.get("stdout") for e in events][-5:]
    assert reports(events) == {
        "a": {"check": False, "x": "a-only-value", "shared": "project", "layered": "site",
              "site_setting": "from site.json", "secret_length": 0},
    }  # fmt: skip
    assert not worker_dir.exists() and not own.exists()  # the worker's job and this host's own part: both gone


def test_a_packed_job_carries_ansibles_verbosity_when_corectl_v_asked_for_it(tmp_path: Path, root: Path, monkeypatch):
    """`corectl -v` sets ANSIBLE_VERBOSITY here; a job run on a runner host or a node gets it in its own settings."""
    site = probe_site(tmp_path, root)
    runner = RunnerSide(remote_dir=PurePosixPath(tmp_path / "w"), fact_cache=PurePosixPath(tmp_path / "f"))
    request = RunRequest(site=site, playbook="probe.yml")
    monkeypatch.delenv("ANSIBLE_VERBOSITY", raising=False)
    assert "ANSIBLE_VERBOSITY" not in pack(request, tmp_path / "quiet", "q", runner, PASSWORD)["envvars"]
    monkeypatch.setenv("ANSIBLE_VERBOSITY", "2")
    assert pack(request, tmp_path / "verbose", "v", runner, PASSWORD)["envvars"]["ANSIBLE_VERBOSITY"] == "2"
