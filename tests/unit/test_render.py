"""hosts.yml rendering: deterministic, complete, stale detection, and the variable layers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from corectl.ansible.runner import shared_inventory
from corectl.cli import app
from corectl.site.loader import load_cluster
from corectl.site.model import Profile
from corectl.site.render import gpu_bindings, render_text, site_vars
from corectl.site.render import switches as render_switches

runner = CliRunner()


def test_render_is_byte_identical_and_lists_13_hosts(prod_copy: Path):
    first = runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    assert first.exit_code == 0, first.output
    text = (prod_copy / "hosts.yml").read_bytes()
    second = runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    assert second.exit_code == 0
    assert (prod_copy / "hosts.yml").read_bytes() == text
    assert "up to date (13 hosts)" in second.output
    data = yaml.safe_load(text)
    assert len(data["all"]["hosts"]) == 13
    # pure JSON (no comment line), so Ansible's loader takes its JSON path, not its YAML parser
    assert json.loads(text) == data


def test_shipped_hosts_yml_is_current(root: Path):
    result = runner.invoke(app, ["render", "--check", "--inventory", "prod"])
    assert result.exit_code == 0, result.output + result.stderr


def test_render_check_detects_stale_file(prod_copy: Path):
    runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    path = prod_copy / "cluster.yml"
    path.write_text(path.read_text().replace("retention: 30d", "retention: 31d"))
    stale = runner.invoke(app, ["render", "--check", "--inventory", str(prod_copy)])
    assert stale.exit_code == 1
    assert "stale" in stale.stderr
    (prod_copy / "hosts.yml").unlink()
    missing = runner.invoke(app, ["render", "--check", "--inventory", str(prod_copy)])
    assert missing.exit_code == 1


def test_groups_and_host_vars(root: Path):
    data = yaml.safe_load(render_text(load_cluster(root / "inventories" / "prod")))["all"]
    children = data["children"]
    assert sorted(children["compute"]["hosts"]) == [f"dgx{i:02d}" for i in range(1, 13)]
    assert list(children["slurm_controller"]["hosts"]) == ["head01"]
    assert sorted(children["profile_dgx_h100"]["hosts"]) == sorted(children["compute"]["hosts"])
    dgx07 = data["hosts"]["dgx07"]
    assert dgx07["corectl_address"] == "10.10.1.17"
    assert dgx07["corectl_leaf"] == "leaf2"
    assert "corectl_hw" not in dgx07  # the profile's hardware is its group's, written once
    assert children["profile_dgx_h100"]["vars"]["corectl_hw"]["cpus"] == 224
    assert "corectl_fabric" not in data["vars"]  # site-wide settings: site.json; switches: switches.json
    assert site_vars(load_cluster(root / "inventories" / "prod"))["corectl_fabric"] == {
        "kind": "infiniband",
        "rate_gbps": 400,
        "rdma": True,
        "nccl": {"NCCL_IB_HCA": ",".join(f"mlx5_{i}" for i in range(8))},
    }
    switches = {s["name"]: s for s in render_switches(load_cluster(root / "inventories" / "prod"))}
    assert switches["leaf1"]["nodes"] == "dgx[01-06]"
    assert switches["spine1"]["switches"] == ["leaf1", "leaf2"]
    assert data["vars"]["ansible_ssh_private_key_file"] == "~/.ssh/corectl_ed25519"


def test_ansible_gives_each_host_its_profiles_hardware(root: Path, tmp_path: Path):
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(render_text(load_cluster(root / "inventories" / "prod")))
    ansible_inventory = str(Path(sys.executable).parent / "ansible-inventory")
    seen = subprocess.run(
        [ansible_inventory, "-i", str(hosts), "--host", "dgx07"], capture_output=True, text=True, check=True
    )
    hw = json.loads(seen.stdout)["corectl_hw"]
    assert hw["cpus"] == 224
    assert hw["gpus"] == {
        "count": 8,
        "model": "h100",
        "nvswitch": True,
        "autodetect": "off",
        "sockets": [0, 0, 0, 0, 1, 1, 1, 1],
    }
    head = subprocess.run(
        [ansible_inventory, "-i", str(hosts), "--host", "head01"], capture_output=True, text=True, check=True
    )
    assert json.loads(head.stdout)["corectl_hw"]["gpus"] is None


def test_schema_is_json_schema_with_every_section():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert set(schema["required"]) == {"cluster", "profiles", "nodes", "slurm"}
    assert {"fabric", "users", "groups", "cephfs", "monitoring"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_variable_layers(tmp_path: Path, root: Path, prod_copy: Path):
    """role defaults < shared group_vars/ < site group_vars/ < site host_vars/ (real Ansible)."""
    runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    (prod_copy / "group_vars").mkdir()
    (prod_copy / "host_vars").mkdir()
    # base_timezone is mapped from cluster.yml in the shared group_vars/all/base.yml
    (prod_copy / "group_vars" / "all.yml").write_text("base_ntp_servers: [site-ntp]\n")
    (prod_copy / "host_vars" / "dgx03.yml").write_text("base_ntp_servers: [host-ntp]\n")
    private = tmp_path / "private"
    shared = shared_inventory(private, root)
    ansible_inventory = Path(sys.executable).parent / "ansible-inventory"

    def host(name: str) -> dict:
        proc = subprocess.run(
            # as ansible-runner runs it: cwd is the project, the playbook dir is playbooks/
            [str(ansible_inventory), "--playbook-dir", str(root / "playbooks"),
             "-i", str(shared), "-i", str(prod_copy / "hosts.yml"), "--host", name],
            capture_output=True, text=True, check=True, cwd=root,
        )  # fmt: skip
        return json.loads(proc.stdout)

    dgx01, dgx03 = host("dgx01"), host("dgx03")
    assert dgx01["base_timezone"] == "{{ corectl_cluster.timezone }}"  # shared layer, templated at run time
    assert dgx01["base_ntp_servers"] == ["site-ntp"]  # site group_vars beat shared group_vars
    assert dgx03["base_ntp_servers"] == ["host-ntp"]  # host_vars beat both
    shutil.rmtree(private)


def test_the_node_list_is_read_where_used_not_carried_by_every_host(tmp_path: Path, root: Path, prod_copy: Path):
    """nodes.json holds the node list and switches.json the fabric's switches; hosts.yml's all.vars
    only names them, so a host's variables do not grow with the cluster; real Ansible still
    resolves the roles' variables built on them."""
    runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    data = yaml.safe_load((prod_copy / "hosts.yml").read_text())["all"]
    assert sorted(data["vars"]) == [  # where to log in, and where the rest is: nothing else per host
        "ansible_ssh_private_key_file", "ansible_user", "corectl_nodes_file", "corectl_secrets_dir",
        "corectl_switches_file",
    ]  # fmt: skip
    site = json.loads((prod_copy / "site.json").read_text())
    assert sorted(site) == sorted(SITE_KEYS)
    switches = json.loads((prod_copy / "switches.json").read_text())
    assert [s["name"] for s in switches] == ["leaf1", "leaf2", "spine1"]
    nodes = json.loads((prod_copy / "nodes.json").read_text())
    assert [n["name"] for n in nodes][:2] == ["dgx01", "dgx02"] and len(nodes) == 13
    assert nodes[0] == {"name": "dgx01", "address": "10.10.1.11", "profile": "dgx-h100", "roles": ["compute"]}
    assert resolved_on_dgx05(root, prod_copy, tmp_path, RESOLVED) == [
        [n["address"] for n in nodes],
        switches,
        site["corectl_slurm"]["partitions"],
        site["corectl_cephfs"]["mounts"],
        site["corectl_cluster"]["timezone"],
        [u["name"] for u in site["corectl_users"]],
    ]


RESOLVED = [
    "firewall_allowed_addresses",
    "slurm_switches",
    "slurm_partitions",
    "cephfs_mounts",
    "base_timezone",
    "users_accounts | map(attribute='name') | list",
]
SITE_KEYS = [
    "corectl_cluster", "corectl_slurm", "corectl_groups", "corectl_users", "corectl_monitoring", "corectl_health",
    "corectl_backup", "corectl_logs", "corectl_fabric", "corectl_cephfs",
]  # fmt: skip


def test_a_site_without_fabric_or_cephfs_resolves_to_empty_lists(tmp_path: Path, root: Path, prod_copy: Path):
    """site.json leaves out what cluster.yml does not declare; the roles' variables are then empty."""
    config = yaml.safe_load((prod_copy / "cluster.yml").read_text())
    config.pop("fabric")
    config.pop("cephfs", None)
    for node in config["nodes"]:
        node.pop("leaf", None)
    (prod_copy / "cluster.yml").write_text(yaml.safe_dump(config))
    rendered = runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    assert rendered.exit_code == 0, rendered.output
    assert sorted(json.loads((prod_copy / "site.json").read_text())) == sorted(SITE_KEYS[:8])
    expressions = ["slurm_switches", "cephfs_mounts", "node_health_mounts"]
    assert resolved_on_dgx05(root, prod_copy, tmp_path, expressions) == [[], [], []]


def test_a_backup_controller_gets_the_controllers_play_and_the_shared_state(tmp_path: Path, root: Path, prod_copy):
    """slurm.backup_controller: its own inventory group (site.yml's controller play runs on it), and the state
    directory both controllers and the backup role read."""
    config = yaml.safe_load((prod_copy / "cluster.yml").read_text())
    config["slurm"].update(backup_controller="dgx01", state_dir="/data/slurm/state", controller_timeout_s=30)
    (prod_copy / "cluster.yml").write_text(yaml.safe_dump(config))
    rendered = runner.invoke(app, ["render", "--inventory", str(prod_copy)])
    assert rendered.exit_code == 0, rendered.output
    children = yaml.safe_load((prod_copy / "hosts.yml").read_text())["all"]["children"]
    assert list(children["slurm_backup_controller"]["hosts"]) == ["dgx01"]
    assert list(children["slurm_controller"]["hosts"]) == ["head01"]
    expressions = ["slurm_controller", "slurm_backup_controller", "slurm_state_dir", "backup_state_dir"]
    expressions.append("slurm_controller_timeout_s")
    assert resolved_on_dgx05(root, prod_copy, tmp_path, expressions) == [
        "head01", "dgx01", "/data/slurm/state", "/data/slurm/state", 30,
    ]  # fmt: skip
    # without one: the local default, and no group
    config["slurm"] = {k: v for k, v in config["slurm"].items() if k not in ("backup_controller", "state_dir")}
    (prod_copy / "cluster.yml").write_text(yaml.safe_dump(config))
    assert runner.invoke(app, ["render", "--inventory", str(prod_copy)]).exit_code == 0
    assert "slurm_backup_controller" not in yaml.safe_load((prod_copy / "hosts.yml").read_text())["all"]["children"]
    assert resolved_on_dgx05(root, prod_copy, tmp_path / "2", ["slurm_backup_controller", "slurm_state_dir"]) == [
        "", "/var/lib/slurm/slurmctld",
    ]  # fmt: skip


def resolved_on_dgx05(root: Path, site_dir: Path, tmp_path: Path, expressions: list[str]) -> list:
    """The values real Ansible gives these expressions on dgx05, with the layers and the extra
    vars (site.json) a corectl run has."""
    shared = shared_inventory(tmp_path / "private", root)
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "dgx05", "-i", str(shared), "-i", str(site_dir / "hosts.yml"),
         "-e", f"@{site_dir / 'site.json'}",  # as corectl.ansible.runner passes it
         "-m", "ansible.builtin.debug", "-a", f"msg={{{{ [{', '.join(expressions)}] }}}}"],
        capture_output=True, text=True, check=True, cwd=root, env=env,
    )  # fmt: skip
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["dgx05"]["msg"]


def _profile(sockets: int, cores: int, gpus: dict | None) -> Profile:
    return Profile.model_validate(
        {"sockets": sockets, "cores_per_socket": cores, "memory_mb": 1024, **({"gpus": gpus} if gpus else {})}
    )


def test_gres_binds_each_gpu_to_its_sockets_cores_in_slurms_numbering():
    dgx = _profile(2, 56, {"count": 8, "model": "h100"})  # the default: split evenly, DGX H100's layout
    assert gpu_bindings(dgx) == [
        {"file": "/dev/nvidia[0-3]", "cores": "0-55"},
        {"file": "/dev/nvidia[4-7]", "cores": "56-111"},
    ]
    declared = _profile(2, 1, {"count": 4, "model": "h100", "sockets": [1, 0, 0, 1]})
    assert gpu_bindings(declared) == [
        {"file": "/dev/nvidia0", "cores": "1"},
        {"file": "/dev/nvidia[1-2]", "cores": "0"},
        {"file": "/dev/nvidia3", "cores": "1"},
    ]
    assert gpu_bindings(_profile(2, 8, {"count": 3, "model": "a100"})) == []  # no even split: no binding
    assert gpu_bindings(_profile(2, 8, None)) == []
