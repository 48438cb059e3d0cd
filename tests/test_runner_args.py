"""What corectl hands to ansible-runner (the boundary is ours; Ansible itself is not mocked)."""

from __future__ import annotations

from pathlib import Path

from corectl.runner import RunRequest, runner_kwargs, stats_from_event
from corectl.site import resolve_site


def test_runner_kwargs(tmp_path: Path, root: Path):
    site = resolve_site("core", root=root)
    private = tmp_path / "private"
    request = RunRequest(site=site, limit="dgx01,dgx02", tags="base", check=True, diff=True, extravars={"x": 1})
    kwargs = runner_kwargs(request, private, "20260101T000000Z-1")
    assert kwargs["private_data_dir"] == str(private)
    assert kwargs["playbook"] == str(root / "playbooks" / "site.yml")
    assert kwargs["project_dir"] == str(root)
    shared, hosts = kwargs["inventory"]
    assert hosts == str(site.hosts_file)
    assert Path(shared).parent.parent == private  # fresh per run, inside the private dir
    assert (Path(shared).parent / "group_vars").resolve() == root / "group_vars"
    assert kwargs["artifact_dir"] == str(site.directory / ".runs")
    assert kwargs["ident"] == "20260101T000000Z-1"
    assert kwargs["rotate_artifacts"] > 0
    assert kwargs["fact_cache"] == str(site.directory / ".facts")  # persistent, not per-run
    assert kwargs["fact_cache_type"] == "jsonfile"
    env = kwargs["envvars"]
    assert env["ANSIBLE_CONFIG"] == str(root / "ansible.cfg")
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert f"UserKnownHostsFile={site.directory / 'known_hosts'}" in env["ANSIBLE_SSH_EXTRA_ARGS"]
    assert "StrictHostKeyChecking=yes" in env["ANSIBLE_SSH_EXTRA_ARGS"]
    assert env["ANSIBLE_SSH_CONTROL_PATH_DIR"].startswith(str(Path.home() / ".ansible" / "cp" / "corectl-"))
    assert kwargs["limit"] == "dgx01,dgx02"
    assert kwargs["tags"] == "base"
    assert kwargs["cmdline"] == "--check --diff"
    assert kwargs["extravars"] == {"x": 1}
    assert 5 <= kwargs["forks"] <= 100
    assert kwargs["quiet"] is True


def test_runner_kwargs_omit_unset_options(tmp_path: Path, root: Path):
    kwargs = runner_kwargs(RunRequest(site=resolve_site("core", root=root)), tmp_path / "p", "id")
    for key in ("limit", "tags", "cmdline", "extravars"):
        assert key not in kwargs


def test_stats_from_event_counts_dark_as_unreachable():
    stats = stats_from_event(
        {"ok": {"a": 3, "b": 1}, "changed": {"a": 2}, "failures": {"b": 1}, "dark": {"c": 1}, "skipped": {}}
    )
    assert stats["a"].ok == 3 and stats["a"].changed == 2 and stats["a"].failed == 0
    assert stats["b"].failed == 1
    assert stats["c"].unreachable == 1
