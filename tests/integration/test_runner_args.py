"""What corectl hands to ansible-runner (the boundary is ours; Ansible itself is not mocked)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import ROOT, probe_project
from corectl.ansible.events import RunRequest, failure_detail, stats_from_event
from corectl.ansible.runner import run_playbook, runner_kwargs
from corectl.site import resolve_site

PROBE = """
- name: Probe
  hosts: all
  gather_facts: true
  gather_subset: ["!all", "!min"]
  tasks:
    - name: Report what the run was given
      ansible.builtin.debug:
        msg:
          check: "{{ ansible_check_mode }}"
          x: "{{ x | default('unset') }}"
          shared: "{{ corectl_probe_shared | default('unset') }}"
          layered: "{{ corectl_probe_layered | default('unset') }}"
      tags: [t1]
    - name: A task of another tag
      ansible.builtin.debug:
        msg: other
      tags: [t2]
"""


def test_a_run_gets_limit_tags_check_extravars_and_layered_group_vars(tmp_path: Path, root: Path):
    """A real ansible-runner run of a probe playbook on two local hosts, through run_playbook."""
    site = probe_project(tmp_path, PROBE, ("a", "b"))  # the project's real Ansible settings
    (site.root / "group_vars" / "all.yml").write_text("corectl_probe_shared: project\ncorectl_probe_layered: project\n")
    (site.directory / "group_vars").mkdir()
    (site.directory / "group_vars" / "all.yml").write_text("corectl_probe_layered: site\n")
    events: list[dict] = []
    request = RunRequest(site=site, playbook="probe.yml", command="probe", limit="a", tags="t1", check=True,
                         extravars={"x": 1}, secrets=False)  # fmt: skip
    result = run_playbook(request, sink=events.append)

    assert result.ok, result.output_tail(20)
    assert set(result.hosts) == {"a"}  # --limit
    tasks = [e["event_data"]["task"] for e in events if e["event"] == "runner_on_ok"]
    assert tasks == ["Gathering Facts", "Report what the run was given"]  # --tags t1 only
    [report] = [e for e in events if e["event"] == "runner_on_ok" and e["event_data"]["task"].startswith("Report")]
    # check mode on, extra vars in, shared group_vars under the site's own (the site wins)
    assert report["event_data"]["res"]["msg"] == {"check": True, "x": 1, "shared": "project", "layered": "site"}
    record = json.loads((result.artifact_dir / "corectl.json").read_text())
    assert result.artifact_dir.parent == site.runs_dir
    assert (record["command"], record["limit"], record["tags"], record["check"]) == ("probe", "a", "t1", True)
    assert record["hosts"]["a"]["ok"] == 2
    # facts persist in the site's cache between runs (gathering=smart reuses them); ansible-core
    # names each file after the host, behind a prefix of its own ("s1_"), and wraps the facts
    [cached] = list(site.facts_dir.iterdir())
    assert cached.name.rpartition("_")[2] == "a"
    facts = json.loads(json.loads(cached.read_text())["__payload__"])
    assert facts["_ansible_facts_gathered"] is True and facts["gather_subset"] == ["!all", "!min"]


def test_runner_kwargs_omit_unset_options(tmp_path: Path, root: Path):
    kwargs = runner_kwargs(RunRequest(site=resolve_site("prod", root=root), playbook="health.yml"), tmp_path / "p")
    for key in ("limit", "tags", "extravars"):
        assert key not in kwargs
    # the site-wide settings, always (secrets.yml only with the vault password)
    assert kwargs["cmdline"] == f"--extra-vars @{root / 'inventories' / 'prod' / 'site.json'}"


def test_stats_from_event_counts_dark_as_unreachable():
    stats = stats_from_event(
        {"ok": {"a": 3, "b": 1}, "changed": {"a": 2}, "failures": {"b": 1}, "dark": {"c": 1}, "skipped": {}}
    )
    assert stats["a"].ok == 3 and stats["a"].changed == 2 and stats["a"].failed == 0
    assert stats["b"].failed == 1
    assert stats["c"].unreachable == 1


def test_failure_detail_names_the_reason():
    banner = (
        'Data could not be sent to remote host "127.0.0.1": @@@@@@@@@@@@\r\n@ WARNING: REMOTE HOST IDENTIFICATION '
        "HAS CHANGED! @\r\n@@@@@@@@@@@@\r\nOffending ED25519 key in known_hosts:2\r\nHost key verification failed."
    )
    assert failure_detail({"res": {"msg": banner}}, unreachable=True) == "Host key verification failed."
    failed = {"res": {"msg": "non-zero return code", "rc": 100, "stderr": "\nE: Unable to locate package x\n"}}
    assert failure_detail(failed, unreachable=False) == "non-zero return code 100: E: Unable to locate package x"
    quiet = {"res": {"msg": "non-zero return code", "rc": 1, "stderr": "", "stdout": "what it did"}}
    assert failure_detail(quiet, unreachable=False) == "non-zero return code"
    assert failure_detail({"res": {"msg": "@@@@\n\n"}}, unreachable=True) == "unreachable"


def test_the_accelerator_is_stock_unless_asked_for_and_names_what_is_missing(monkeypatch):
    import importlib.util

    import pytest

    from corectl.ansible.runner import accelerator_env
    from corectl.errors import CorectlError

    monkeypatch.delenv("CORECTL_ACCELERATOR", raising=False)
    assert accelerator_env() == {}
    assert accelerator_env("none") == {}
    unknown = r"^CORECTL_ACCELERATOR=turbo: unknown accelerator \(one of: none, mitogen\)$"
    with pytest.raises(CorectlError, match=unknown):
        accelerator_env("turbo")
    if importlib.util.find_spec("ansible_mitogen") is None:
        with pytest.raises(CorectlError, match="mitogen is not installed"):
            accelerator_env("mitogen")
        return
    assert accelerator_env("mitogen") == {"ANSIBLE_STRATEGY": "corectl.fleet.mitogen_linear"}
    collection = ROOT / "collections/ansible_collections/corectl/fleet"
    assert (collection / "plugins/strategy/mitogen_linear.py").is_file()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CorectlError, match=r"pip install 'corectl\[mitogen\]'"):
        accelerator_env("mitogen")


STRATEGY_CHECK = """
import importlib.util, json, sys
import ansible.collections.list, ansible_mitogen.planner
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader()
stock = ansible_mitogen.planner._load_collections
spec = importlib.util.spec_from_file_location("corectl_strategy", sys.argv[1])
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)
class Invocation:
    def __init__(self):
        self._extra_sys_paths = set()
expected, ours = Invocation(), Invocation()
stock(expected)
scans, real = [], ansible.collections.list.list_collection_dirs
ansible.collections.list.list_collection_dirs = lambda: scans.append(1) or real()
for _ in range(3):
    plugin._load_collections(ours)
print(json.dumps({"replaced": ansible_mitogen.planner._load_collections is plugin._load_collections,
                  "expected": sorted(expected._extra_sys_paths), "ours": sorted(ours._extra_sys_paths),
                  "scans": len(scans)}))
"""


def test_corectl_mitogen_strategy_scans_the_collections_once_and_hands_on_the_same_paths():
    """corectl.fleet.mitogen_linear replaces Mitogen's per-worker collection scan with one list,
    made once; a module's invocation gets exactly the paths Mitogen's own function gives it."""
    import importlib.util
    import subprocess
    import sys

    import pytest

    if importlib.util.find_spec("ansible_mitogen") is None:
        pytest.skip("mitogen is not installed")
    root = ROOT
    plugin = root / "collections/ansible_collections/corectl/fleet/plugins/strategy/mitogen_linear.py"
    env = {**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg")}
    out = subprocess.run([sys.executable, "-c", STRATEGY_CHECK, str(plugin)], cwd=root, env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["replaced"]
    assert result["ours"] == result["expected"]
    assert any(path.endswith("ansible_collections/corectl/fleet") for path in result["ours"])
    assert result["scans"] <= 1  # once per process (none if already made), not once per call


def changed_settings(env: dict[str, str]) -> str:
    """`ansible-config dump --only-changed` under ``env``: the settings the project's configuration changes."""
    import subprocess
    import sys

    config = Path(sys.executable).parent / "ansible-config"
    return subprocess.run(
        [str(config), "dump", "--only-changed"], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def test_stock_ansible_runs_with_the_projects_config_share_no_fact_cache():
    """ansible.cfg sets no fact cache (each corectl run gets its site's own through ansible-runner): a stock
    `ansible` or `ansible-playbook` with the project's config keeps facts in memory, so two sites' head01 never
    read each other's facts (issue 46 item 7). Read back through Ansible's own configuration reader."""

    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    for name in [k for k in env if k.startswith("ANSIBLE_CACHE_PLUGIN")]:
        del env[name]
    dumped = changed_settings(env)
    changed = {line.split("(")[0].strip() for line in dumped.splitlines()}
    assert not {"CACHE_PLUGIN", "CACHE_PLUGIN_CONNECTION"} & changed, dumped
    assert "CACHE_PLUGIN_TIMEOUT" in changed, dumped  # the file was read


PREFORK_CHECK = """
import json
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader, init_plugin_loader, test_loader
from ansible._internal._templating._jinja_bits import AnsibleEnvironment
init_plugin_loader()
before = [len(filter_loader._cached_non_collection_wrappers), len(test_loader._cached_non_collection_wrappers),
          len(AnsibleEnvironment._lexer_cache)]
from ansible_collections.corectl.fleet.plugins.plugin_utils.prefork import load_before_fork
load_before_fork(DataLoader())
after = [len(filter_loader._cached_non_collection_wrappers), len(test_loader._cached_non_collection_wrappers),
         len(AnsibleEnvironment._lexer_cache)]
print(json.dumps({"before": before, "after": after, "bool": "bool" in filter_loader._cached_non_collection_wrappers,
                  "defined": "defined" in test_loader._cached_non_collection_wrappers}))
"""

PLAY = """
- name: Filters and tests in forked workers
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Render a filter and a test
      ansible.builtin.debug:
        msg: >-
          {{ [3, 1, 2] | sort | first is number }}
          {{ [] | corectl.fleet.slurm_version_problems('', '') | length is number }}
"""


def test_the_default_strategy_loads_jinjas_plugins_before_it_forks_and_runs_plays_as_linear(tmp_path: Path):
    """ansible.cfg's strategy is corectl.fleet.linear (Ansible's linear; Jinja's filter and test plugins and its
    lexer loaded in the strategy's process before the workers fork, so no worker loads them again): the warm-up
    loads what it says, and a play through the project's config renders built-in and collection filters."""
    import subprocess
    import sys

    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    env.pop("ANSIBLE_STRATEGY", None)
    bindir = Path(sys.executable).parent
    dumped = changed_settings(env)
    assert "DEFAULT_STRATEGY(" in dumped and "= corectl.fleet.linear" in dumped, dumped
    out = subprocess.run([sys.executable, "-c", PREFORK_CHECK], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert loaded["before"] == [0, 0, 0], loaded  # nothing is loaded until something renders
    assert all(n > 0 for n in loaded["after"]) and loaded["bool"] and loaded["defined"], loaded
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY)
    ran = subprocess.run([str(bindir / "ansible-playbook"), "-i", "localhost,", str(playbook)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "msg: True True" in ran.stdout, ran.stdout
