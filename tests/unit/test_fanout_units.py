"""Fan-out over runner hosts (cluster.yml control): shard planning, validation, the runner side.

The runs themselves go through real SSH to runner stand-ins in tests/e2e/test_fleet.py.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import pytest
from typer.testing import CliRunner

from corectl.ansible.remote import fanout, jobpack, runnerhost, shards
from corectl.ansible.remote.fanout import targets
from corectl.cli import app
from corectl.site import Site
from corectl.site.inventory import render_site
from corectl.site.loader import load_cluster
from corectl.site.model import Cluster, Control, Node
from corectl.site.model_services import RunnerHost

CONTROL = """
control:
  runners:
    - {name: r1, host: 10.10.0.201}
    - {name: r2, host: 10.10.0.202}
  shard_by: SHARD
"""


def _control(shard_by: str = "leaf", count: int = 2) -> Control:
    runners = [RunnerHost(name=f"r{i}", host=f"10.10.0.{200 + i}") for i in range(1, count + 1)]
    return Control(runners=runners, shard_by=shard_by)


def test_services_first_then_one_shard_per_leaf_round_robin(root: Path):
    cluster = load_cluster(root / "inventories" / "prod")
    plan = shards.plan(cluster, [n.name for n in cluster.nodes], _control("leaf"))
    assert [(s.name, s.phase, s.runner.name) for s in plan] == [
        ("services", 1, "r1"),
        ("leaf-leaf1", 2, "r1"),
        ("leaf-leaf2", 2, "r2"),
    ]
    assert plan[0].hosts == ("head01",)
    assert plan[1].hosts == tuple(f"dgx{i:02d}" for i in range(1, 7))
    every = [h for s in plan for h in s.hosts]
    assert sorted(every) == sorted(n.name for n in cluster.nodes)  # each host in exactly one shard


def test_rack_shards_and_a_narrowed_run(root: Path):
    cluster = load_cluster(root / "inventories" / "prod")
    # one runner: its two racks share one job (one ansible-playbook), named after the runner
    plan = shards.plan(cluster, ["dgx02", "dgx08", "dgx09"], _control("rack", count=1))
    assert [(s.name, s.runner.name, s.hosts, s.groups) for s in plan] == [
        ("r1-1", "r1", ("dgx02", "dgx08", "dgx09"), ("rack-r01", "rack-r02")),
    ]
    # two runners: a rack each, each shard named after its rack
    plan = shards.plan(cluster, ["dgx02", "dgx08", "dgx09"], _control("rack", count=2))
    assert [(s.name, s.runner.name, s.hosts) for s in plan] == [
        ("rack-r01", "r1", ("dgx02",)),
        ("rack-r02", "r2", ("dgx08", "dgx09")),
    ]


def _fleet(racks: int, per_rack: int) -> Cluster:
    """A cluster of ``racks`` racks of ``per_rack`` compute nodes and one head node."""
    head = Node.model_construct(name="head", roles=("slurm_controller",), rack=None, leaf=None)
    nodes = [
        Node.model_construct(name=f"n{r:03d}{i}", roles=("compute",), rack=f"r{r:03d}", leaf=None)
        for r in range(racks)
        for i in range(per_rack)
    ]
    return Cluster.model_construct(nodes=(head, *nodes))


def test_many_small_racks_make_one_job_per_runner_up_to_shard_hosts():
    cluster = _fleet(racks=250, per_rack=4)  # 1,000 compute nodes in four-node racks
    control = Control(runners=_control(count=2).runners, shard_by="rack", shard_hosts=300)
    plan = shards.plan(cluster, [n.name for n in cluster.nodes], control)
    compute = [s for s in plan if s.phase == 2]
    assert [(s.name, s.runner.name, len(s.hosts), len(s.groups)) for s in compute] == [
        ("r1-1", "r1", 300, 75),
        ("r1-2", "r1", 200, 50),
        ("r2-1", "r2", 300, 75),
        ("r2-2", "r2", 200, 50),
    ]
    assert compute[0].groups[:2] == ("rack-r000", "rack-r002")  # dealt alternately, kept whole
    every = [h for s in plan for h in s.hosts]
    assert sorted(every) == sorted(n.name for n in cluster.nodes)


def test_a_rack_larger_than_shard_hosts_is_cut_into_parts():
    cluster = _fleet(racks=1, per_rack=7)
    control = Control(runners=_control(count=2).runners, shard_by="rack", shard_hosts=3)
    plan = shards.plan(cluster, [n.name for n in cluster.nodes], control)
    assert [(s.name, s.runner.name, s.hosts) for s in plan] == [
        ("services", "r1", ("head",)),
        ("rack-r000.1", "r1", ("n0000", "n0001", "n0002")),
        ("rack-r000.3", "r1", ("n0006",)),
        ("rack-r000.2", "r2", ("n0003", "n0004", "n0005")),
    ]


def test_nodes_without_a_leaf_share_one_shard(root: Path):
    cluster = load_cluster(root / "inventories" / "prod")
    plan = shards.plan(cluster, ["head01", "dgx01"], _control("leaf"))
    assert [(s.name, s.hosts) for s in plan] == [("services", ("head01",)), ("leaf-leaf1", ("dgx01",))]
    no_rack = shards.plan(cluster.model_copy(), ["dgx01"], Control(runners=_control().runners, shard_by="rack"))
    assert no_rack[0].name == "rack-r01"


def test_targets_narrow_like_ansible(prod_copy: Path, root: Path):
    site = Site(root=root, directory=prod_copy)
    render_site(site, check_only=False)
    assert targets(site, None)[0] == "dgx01" and len(targets(site, None)) == 13
    assert sorted(targets(site, "compute:!dgx0*")) == ["dgx10", "dgx11", "dgx12"]


def test_a_limit_that_matches_nothing_is_refused(prod_copy: Path, root: Path):
    site = Site(root=root, directory=prod_copy)
    render_site(site, check_only=False)
    with pytest.raises(Exception, match="matches no node"):
        targets(site, "dgx99")


@pytest.mark.parametrize(
    ("section", "path", "words"),
    [
        (CONTROL.replace("SHARD", "leaf").replace("name: r2", "name: r1"), "control.runners[1].name", "duplicate"),
        (CONTROL.replace("SHARD", "switch"), "control.shard_by", "'leaf' or 'rack'"),
        (CONTROL.replace("SHARD", "leaf").replace("10.10.0.202", "10.10.0.201"), "control.runners[1].host", "dup"),
        (CONTROL.replace("SHARD", "leaf") + "  bogus: 1\n", "control.bogus", "unknown key"),
        # node_local (issue 30, tests/unit/test_nodelocal_units.py)
        ("node_local:\n  mode: always\n", "node_local.mode", "'off', 'on' or 'auto'"),
        ("node_local:\n  mode: auto\n  parallel: 0\n", "node_local.parallel", "greater than or equal to 1"),
        ("node_local:\n  mode: auto\n  job_dir: shm\n", "node_local.job_dir", "(got 'shm')"),
        ("node_local:\n  mode: auto\n  bogus: 1\n", "node_local.bogus", "unknown key"),
    ],
)
def test_a_bad_control_section_is_a_file_line_error(prod_copy: Path, section: str, path: str, words: str):
    cluster_yml = prod_copy / "cluster.yml"
    cluster_yml.write_text(cluster_yml.read_text() + section)
    result = CliRunner().invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert re.match(rf"^\S*cluster\.yml:\d+: {re.escape(path)}: .*{re.escape(words)}", line), line
    assert "Traceback" not in result.output


def test_runners_need_the_site_key(prod_copy: Path):
    cluster_yml = prod_copy / "cluster.yml"
    text = cluster_yml.read_text().replace("    key: ~/.ssh/corectl_ed25519\n", "")
    cluster_yml.write_text(text + CONTROL.replace("SHARD", "leaf"))
    result = CliRunner().invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2
    assert "control.runners: runners need cluster.ssh.key" in result.output


def test_the_runner_payload_holds_every_collection_the_roles_name(root: Path):
    named = set()
    for path in [*root.glob("roles/**/*.yml"), *root.glob("playbooks/*.yml")]:
        named |= set(re.findall(r"\b([a-z_]+\.[a-z_]+)\.[a-z_]+:", path.read_text()))
    named -= {"ansible.builtin"}
    named = {n for n in named if n.split(".")[0] in ("ansible", "community", "containers", "kubernetes")}
    assert named <= set(runnerhost.COLLECTIONS), f"add to runnerhost.COLLECTIONS: {named - set(runnerhost.COLLECTIONS)}"


def test_the_cancel_command_names_the_job_but_not_itself():
    remote = PurePosixPath("/dev/shm/corectl-job-20261124T101010Z-42-rack-rack1")
    command = runnerhost.cancel_command(remote)
    pattern = command.split()[3].rstrip(";")
    assert re.search(pattern, f"ansible-runner worker --private-data-dir {remote} --delete")
    assert re.search(pattern, command) is None  # pkill -f would otherwise stop its own shell
    with pytest.raises(ValueError):
        runnerhost.cancel_command(PurePosixPath("/tmp/x; reboot"))


def test_a_job_checks_the_runner_stamp_before_the_worker_starts():
    control = _control()
    command = runnerhost.worker_command(control.runner_dir, PurePosixPath("/dev/shm/corectl-job-x"), "0123abcd")
    python, _, stamp = command.partition(f"exit {runnerhost.UNFIT_EXIT}; }}; ")
    assert "python3 -c" in python
    check, _, rest = stamp.partition("||")
    assert "cat /var/lib/corectl-runner/stamp" in check and "= 0123abcd" in check
    assert f"exit {runnerhost.STALE_EXIT}" in rest
    assert rest.strip().endswith("ansible-runner worker --private-data-dir /dev/shm/corectl-job-x --delete")


def test_under_mitogen_runner_jobs_get_mitogen_from_their_bootstrap(monkeypatch: pytest.MonkeyPatch):
    """CORECTL_ACCELERATOR=mitogen reaches the runners: the payload holds Mitogen, jobs name it."""
    names = {dist.metadata["Name"] for dist in runnerhost.closure()}
    assert {"ansible-core", "ansible-runner", "mitogen"} <= names  # mitogen: the dev install has it
    monkeypatch.setenv("CORECTL_ACCELERATOR", "mitogen")
    assert fanout.runner_accelerator() == {"ANSIBLE_STRATEGY": "corectl.fleet.mitogen_linear"}
    files = {name for name, _ in runnerhost._payload_files()}
    assert {"lib/ansible_mitogen/strategy.py", "lib/ansible_mitogen/planner.py"} <= files
    assert "collections" in jobpack.PROJECT_PARTS  # the strategy plugin travels with every job
    monkeypatch.setenv("CORECTL_ACCELERATOR", "none")
    assert fanout.runner_accelerator() is None


def test_the_nodes_payload_is_built_once_per_version_across_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A node-local run's followers (forked processes) each need the install after an upgrade: the first builds it,
    the others read it; another control-host version builds its own and the old one goes."""
    import multiprocessing

    built = tmp_path / "built"
    built.mkdir()

    def build(runner_dir: PurePosixPath) -> bytes:
        (built / str(len(list(built.iterdir())))).write_text(str(runner_dir))
        return f"payload for {runner_dir}".encode()

    monkeypatch.setattr(runnerhost, "payload", build)
    kept, install = tmp_path / "payloads", PurePosixPath("/var/lib/corectl-local")
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=runnerhost.kept_payload, args=(install, "aaaa", kept)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    assert [p.exitcode for p in processes] == [0, 0, 0] and len(list(built.iterdir())) == 1
    assert runnerhost.kept_payload(install, "aaaa", kept) == b"payload for /var/lib/corectl-local"
    assert len(list(built.iterdir())) == 1  # (read, not built again)
    assert runnerhost.kept_payload(install, "bbbb", kept) == b"payload for /var/lib/corectl-local"
    assert len(list(built.iterdir())) == 2
    assert [p.name.split("-")[0] for p in kept.glob("*.tar.gz")] == ["bbbb"]
