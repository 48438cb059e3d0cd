"""cluster.yml validation: the shipped site passes; each broken variant fails with file:line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corectl.cli import app
from corectl.site.loader import load_cluster

runner = CliRunner()
ERROR_LINE = re.compile(r"^(?P<file>\S+cluster\.yml):(?P<line>\d+): (?P<path>\S+): (?P<message>.+)$")

# (what to replace in inventories/prod/cluster.yml, replacement, field path, words of the message)
# The expected line is where the replacement text starts.
VARIANTS = [
    ("  name: prod\n", "  nmae: prod\n", "cluster.nmae", "unknown key (did you mean 'name'?)"),
    (
        "    profile: dgx-h100\n    roles: [compute]\n    rack: r01",
        "    profile: dgx-h200\n    roles: [compute]\n    rack: r01",
        "nodes[1].profile",
        "unknown profile 'dgx-h200'",
    ),
    ("    address: 10.10.1.17\n", "    address: 10.10.1.14\n", "nodes[2].address", "duplicate node address"),
    ("  - name: dgx[07-12]\n", "  - name: dgx[01-06]\n", "nodes[2].name", "duplicate node name 'dgx01' and 5 more"),
    ("    uid: 21002\n", "    uid: 21001\n", "users[1].uid", "duplicate uid '21001'"),
    ("    gid: 20001\n", "    gid: 20000\n", "groups[1].gid", "duplicate gid '20000'"),
    (
        "    group: research\n    ssh_keys:",
        "    group: reserch\n    ssh_keys:",
        "users[0].group",
        "unknown group 'reserch'",
    ),
    ("      nodes: dgx[01-12]\n", "      nodes: dgx[01-13]\n", "slurm.partitions[0].nodes", "unknown node 'dgx13'"),
    (
        "      switches: [leaf1, leaf2]\n",
        "      switches: [leaf1, leaf3]\n",
        "fabric.switches[2].switches[1]",
        "unknown switch 'leaf3'",
    ),
    # no leaf key is left to point at: the error points at the node entry
    (
        "    rack: r02\n    leaf: leaf2\n",
        "    rack: r02\n",
        "nodes[2].leaf",
        "hangs off no leaf switch",
        "  - name: dgx[07-12]",
    ),
    (
        "    roles: [compute]\n    rack: r02",
        "    roles: [compute, slurm_controller]\n    rack: r02",
        "nodes[2].roles",
        "second slurm_controller",
    ),
    (
        "    threads_per_core: 2\n    memory_mb: 2000000",
        "    threads_per_core: two\n    memory_mb: 2000000",
        "profiles.dgx-h100.threads_per_core",
        "valid integer",
    ),
    ("  timezone: Europe/Berlin\n", "  timezone: Europe/Berln\n", "cluster.timezone", "unknown time zone"),
    (
        "    roles: [compute]\n    rack: r01",
        "    roles: [compute, gpu]\n    rack: r01",
        "nodes[1].roles[1]",
        "input should be 'slurm_controller'",
    ),
    ("  retention: 30d\n", "  retention: 30d\n  retension: 30d\n", "monitoring.retension", "did you mean 'retention'"),
    (
        "      default: true\n      max_time: 2-00:00:00\n",
        "      default: true\n      max_time: 2-00:00:00\n    - name: batch\n      nodes: dgx01\n",
        "slurm.partitions[1].name",
        "duplicate partition name 'batch'",
    ),
    ("  name: prod\n", "  name: prod\n  name: prod2\n", "(yaml)", "duplicate key"),
    # the parser stops at the first list item after the unclosed flow sequence
    ("  ntp_servers:\n", "  ntp_servers: [\n", "(yaml)", "expected the node content, but found '-'", "    - 10.10.0.1"),
    ("    leaf: leaf2\n", "    leaf: spine1\n", "nodes[2].leaf", "not a leaf"),
    ("      mountpoint: /data\n", "      mountpoint: /home\n", "cephfs.mounts[1].mountpoint", "duplicate mountpoint"),
    # hostile values (tests/unit/test_hostile_input.py has a corpus of whole files)
    (
        "    SLURM_CONF_SERVER: head01\n",
        "    SLURM_CONF_SERVER: \"{{ lookup('pipe', 'id') }}\"\n",
        "cluster.environment.SLURM_CONF_SERVER",
        "must not contain Jinja template markers ('{{')",
    ),
    (
        "    - 10.10.0.2\n",
        '    - "10.10.0.2\\nserver 203.0.113.66"\n',
        "cluster.ntp_servers[1]",
        "must not contain a newline or control character",
    ),
    ("    rack: r02\n", "    rack: r02 {% raw %}\n", "nodes[2].rack", "Jinja"),
    ("    - 10.10.2.2:6789\n", "    - 10.10.2.2:67890\n", "cephfs.monitors[1]", "out of range 1-65535"),
    ("  - name: dgx[07-12]\n", "  - name: dgx[07-99999999]\n", "nodes[2].name", "past the limit of 100,000 nodes"),
    ("    user: root\n", "    user: root\n    jump_host: admin@bastion:0\n", "cluster.ssh.jump_host", "port 0"),
    ("  timezone: Europe/Berlin\n", "  timezone: ../../../etc/passwd\n", "cluster.timezone", "should match pattern"),
    ("      - ssh-ed25519 AAAA", '      - from="*" ssh-ed25519 AAAA', "users[0].ssh_keys[0]", "options"),
    (
        "      - ssh-ed25519 AAAA",
        "      - ssh-rsa AAAA",
        "users[0].ssh_keys[0]",
        "key, not 'ssh-rsa'",
    ),
    ("    gid: 20001\n", "    gid: !!python/object/apply:os.system [id]\n", "groups[1].gid", "YAML tag"),
    (
        "      sockets: [0, 0, 0, 0, 1, 1, 1, 1]\n",
        "      sockets: [0, 0, 0, 1, 1, 1, 1]\n",
        "profiles.dgx-h100.gpus.sockets",
        "names 7 sockets for 8 GPUs (one per GPU)",
    ),
    (
        "      sockets: [0, 0, 0, 0, 1, 1, 1, 1]\n",
        "      sockets: [0, 0, 0, 0, 1, 1, 2, 2]\n",
        "profiles.dgx-h100.gpus.sockets",
        "socket 2 does not exist (the profile has 2, from 0)",
    ),
    # issue 33: the site's Xid classes
    ("{63: application}", "{63: harmless}", "health.xid_classes.63", "should be 'ignore', 'application' or 'hardware'"),
    ("{63: application}", "{-5: application}", "health.xid_classes.-5", "greater than or equal to 1"),
    (
        "{max_temperature: 87,",
        "{max_temperature: -5,",
        "health.thresholds.max_temperature",
        "greater than or equal to 0",
    ),
    ("{max_temperature: 87,", "{xid_window_s: 0,", "health.thresholds.xid_window_s", "must be at least 1 (0 would"),
    ("{max_temperature: 87,", "{max_temp: 87,", "health.thresholds.max_temp", "should be 'max_temperature', "),
    ("interval_min: 60,", "interval_min: 0,", "health.validation.interval_min", "greater than or equal to 1"),
    ("dcgm_level: 2,", "dcgm_level: 4,", "health.validation.dcgm_level", "should be 1, 2 or 3"),
    (
        "pairwise_interval_min: 1440}",
        "pairwise_interval_min: 0}",
        "health.validation.pairwise_interval_min",
        "greater than or equal to 1",
    ),
    ("max_nodes: 4,", "max_nodes: 4, qos: normal,", "health.validation.qos", "QOS 'normal' is a user QOS"),
    # issue 34: backups of the head node
    (
        "{destination: /data/corectl-backups,",
        "{destination: data/corectl-backups,",
        "backup.destination",
        "must be an absolute path without '..' (got 'data/corectl-backups')",
    ),
    ("{destination: /data/corectl-backups,", "{destination: /data/../etc,", "backup.destination", "without '..'"),
    ("retention: 14,", "retention: 0,", "backup.retention", "greater than or equal to 1"),
    ("retention: 14,", "retention: 14, alert_after_h: 0,", "backup.alert_after_h", "greater than or equal to 1"),
    ('schedule: "*-*-* 02:30:00"', 'schedule: "daily; rm -rf /"', "backup.schedule", "should match pattern"),
    (
        "prometheus: true}",
        "prometheus: true, ssh: {host: backup01, host_key: ssh-ed25519 notakey!}}",
        "backup.ssh.host_key",
        "should match pattern",
    ),
    ("prometheus: true}", "prometheus: true, ssh: {host_key: x}}", "backup.ssh.host", "required key"),
    (
        "roles: [slurm_controller, slurm_dbd, login, monitoring]",
        "roles: [slurm_controller, slurm_dbd, login]",
        "backup.prometheus",
        "needs monitoring.prometheus on a node of role monitoring",
        "prometheus: true}",
    ),
    ("logs: {host: head01,", "logs: {host: head09,", "logs.host", "'head09' is not a node of this cluster"),
    ("keep_days: 30, max_mb: 2048}", "keep_days: 0, max_mb: 2048}", "logs.keep_days", "greater than or equal to 1"),
    # issue 34: a backup controller
    (
        "  accounting: true\n  pam_slurm_adopt",
        "  accounting: true\n  backup_controller: head09\n  state_dir: /data/slurm\n  pam_slurm_adopt",
        "slurm.backup_controller",
        "'head09' is not a node of this cluster",
    ),
    (
        "  accounting: true\n  pam_slurm_adopt",
        "  accounting: true\n  backup_controller: head01\n  state_dir: /data/slurm\n  pam_slurm_adopt",
        "slurm.backup_controller",
        "'head01' is the controller itself",
    ),
    (
        "  accounting: true\n  pam_slurm_adopt",
        "  accounting: true\n  backup_controller: dgx01\n  pam_slurm_adopt",
        "slurm.backup_controller",
        "needs slurm.state_dir under a cephfs mountpoint (/home, /data): both controllers must see it",
    ),
    (
        "  accounting: true\n  pam_slurm_adopt",
        "  accounting: true\n  backup_controller: dgx01\n  state_dir: /var/lib/slurm/ctld\n  pam_slurm_adopt",
        "slurm.state_dir",
        "'/var/lib/slurm/ctld' is not under a cephfs mountpoint",
        "  state_dir: /var/lib/slurm/ctld\n",
    ),
    (
        "  accounting: true\n  pam_slurm_adopt",
        "  accounting: true\n  controller_timeout_s: 1\n  pam_slurm_adopt",
        "slurm.controller_timeout_s",
        "greater than or equal to 5",
    ),
    # issue 29: Alertmanager's receivers and routes
    ("    receiver: operators\n", "    receiver: opers\n", "monitoring.alerts.receiver", "unknown receiver 'opers'"),
    (
        "      - {receiver: oncall, severity: [critical]}",
        "      - {receiver: pager, severity: [critical]}",
        "monitoring.alerts.routes[0].receiver",
        "unknown receiver 'pager' (declared: oncall, operators)",
    ),
    (
        "      - {receiver: oncall, severity: [critical]}",
        "      - {receiver: oncall}",
        "monitoring.alerts.routes[0]",
        "names no severity and no alerts",
    ),
    (
        "      - {receiver: oncall, severity: [critical]}",
        "      - {receiver: oncall, severity: [page]}",
        "monitoring.alerts.routes[0].severity[0]",
        "should be 'warning' or 'critical'",
    ),
    (
        "      - {name: oncall, email: [hpc-oncall@example.org]}",
        "      - {name: oncall, email: [hpc-oncall]}",
        "monitoring.alerts.receivers[1].email[0]",
        "should match pattern",
    ),
    (
        "      - {name: oncall, email: [hpc-oncall@example.org]}",
        "      - {name: oncall}",
        "monitoring.alerts.receivers[1]",
        "receiver 'oncall' has no email and no webhook",
    ),
    (
        '    smtp: {smarthost: "mail.example.org:587", sender: alertmanager@example.org}\n',
        "",
        "monitoring.alerts.receivers[0].email",
        "e-mail needs monitoring.alerts.smtp",
        "      - {name: operators, email: [hpc-ops@example.org]}",
    ),
    # issue 29: Grafana over Prometheus
    (
        "  prometheus: true\n  scrape_interval: 30s",
        "  prometheus: false\n  scrape_interval: 30s",
        "monitoring.grafana",
        "needs monitoring.prometheus (Grafana's data source)",
        "  grafana:\n",
    ),
    (
        "    anonymous_viewers: true\n",
        "    anonymous_viewers: maybe\n",
        "monitoring.grafana.anonymous_viewers",
        "valid boolean",
    ),
    # issue 47: hot spares are declared nodes of their partition, fewer than its nodes, each in one pool
    (
        "      nodes: dgx[01-12]\n      default: true\n",
        "      nodes: dgx[01-12]\n      spares: {nodes: dgx13}\n      default: true\n",
        "slurm.partitions[0].spares.nodes",
        "spare 'dgx13' is not a declared node",
    ),
    (
        '      max_time: "08:00:00"\n',
        '      max_time: "08:00:00"\n      spares: {count: 2}\n',
        "slurm.partitions[1].spares.count",
        "2 spares for the 2 nodes of partition interactive: at least one must be in service",
        "      spares: {count: 2}\n",
    ),
    (
        '      max_time: 2-00:00:00\n    - name: interactive\n      nodes: dgx[11-12]\n      max_time: "08',
        "      max_time: 2-00:00:00\n      spares: {nodes: dgx12}\n    - name: interactive\n      nodes: dgx[11-12]\n"
        '      spares: {nodes: dgx12}\n      max_time: "08',
        "slurm.partitions[1].spares.nodes",
        "spare 'dgx12' is already a spare of partition batch",
        '      spares: {nodes: dgx12}\n      max_time: "08',
    ),
    # an error on line 100: printed as ":100:", not as rich's emoji code for it
    ("    uid: 21002\n", "    uid: 999\n", "users[1].uid", "greater than or equal to 1000", "    uid: 999\n"),
]


def _variant(prod_copy: Path, old: str, new: str) -> int:
    path = prod_copy / "cluster.yml"
    text = path.read_text()
    assert text.count(old) >= 1, f"fixture text not found: {old!r}"
    index = text.index(old)
    path.write_text(text[:index] + new + text[index + len(old) :])
    # line of the first character that differs
    differ = next(i for i, (a, b) in enumerate(zip(old + "\0", new + "\0", strict=False)) if a != b)
    return text[: index + differ].count("\n") + 1


def test_shipped_core_site_is_valid(root: Path):
    cluster = load_cluster(root / "inventories" / "prod")
    assert len(cluster.nodes) == 13
    assert [n.name for n in cluster.with_role("slurm_controller")] == ["head01"]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v[2] + ":" + v[3][:20] for v in VARIANTS])
def test_broken_variant_fails_with_file_line(prod_copy: Path, variant):
    old, new, path, words = variant[:4]
    line = _variant(prod_copy, old, new)
    if path == "users[1].uid":  # the variant that keeps line 100 honest
        assert line == 100, f"the uid variant is on line {line}: move it to line 100"
    if len(variant) > 4:
        text = (prod_copy / "cluster.yml").read_text()
        line = text[: text.index(variant[4])].count("\n") + 1
    result = runner.invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    parsed = [ERROR_LINE.match(text) for text in lines]
    assert all(parsed), lines
    ours = [m for m in parsed if m and m["path"] == path]
    assert ours, f"no error for {path}: {lines}"
    assert any(words in m["message"] for m in ours), lines
    assert int(ours[0]["line"]) == line, lines
    assert ours[0]["file"].endswith("cluster.yml")


def test_cli_prints_one_line_error_without_traceback(prod_copy: Path, root: Path):
    import subprocess
    import sys

    _variant(prod_copy, "  name: prod\n", "  nmae: prod\n")
    proc = subprocess.run(
        [sys.executable, "-m", "corectl.cli", "validate", "--inventory", str(prod_copy)],
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"{prod_copy}/cluster.yml:3: cluster.name: required key is missing",
        f"{prod_copy}/cluster.yml:4: cluster.nmae: unknown key (did you mean 'name'?)",
    ]


def test_missing_site_is_a_clean_error(tmp_path: Path):
    result = runner.invoke(app, ["validate", "--inventory", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "cluster.yml: not found" in result.stderr


def test_validate_reports_node_count(root: Path):
    result = runner.invoke(app, ["validate", "--inventory", "prod"])
    assert result.exit_code == 0, result.output
    assert "valid (13 nodes)" in result.output


def test_backup_of_prometheus_data_needs_prometheus_on_the_backups_host(prod_copy: Path):
    """The backup reads the snapshot Prometheus writes to its own disk: both on the accounting database's host."""
    _variant(
        prod_copy,
        "roles: [slurm_controller, slurm_dbd, login, monitoring]",
        "roles: [slurm_controller, slurm_dbd, login]",
    )
    _variant(
        prod_copy,
        "    profile: dgx-h100\n    roles: [compute]\n    rack: r01",
        "    profile: dgx-h100\n    roles: [compute, monitoring]\n    rack: r01",
    )
    result = runner.invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2, result.output
    text = (prod_copy / "cluster.yml").read_text()
    line = text[: text.index("prometheus: true}")].count("\n") + 1
    assert result.stderr.splitlines() == [
        f"{prod_copy}/cluster.yml:{line}: backup.prometheus: Prometheus runs on dgx01, dgx02, dgx03, dgx04, dgx05, "
        "dgx06, the backups on head01: they must be one host (the snapshot is read from Prometheus's own disk)"
    ]
