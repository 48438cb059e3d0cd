"""The stand-in harness: molecule and the lab run nodes from the same image with the same flags."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from corectl.errors import CorectlError
from corectl.lab import image
from corectl.lab.inventory import lab_cluster, write_inventory
from corectl.lab.nodes import NODE_FLAGS, forget_host_key, remove_slurm_cgroups
from corectl.lab.spec import LabNode, LabSpec, load_spec, save_spec
from corectl.site import Site


def _platform_flags(platform: dict) -> set[str]:
    flags = {f"--cap-add={cap}" for cap in platform["capabilities"]}
    flags |= {f"--security-opt={opt}" for opt in platform["security_opts"]}
    flags.add(f"--cgroupns={platform['cgroupns_mode']}")
    flags |= {f"--volume={vol}" for vol in platform["volumes"]}
    flags |= {f"--tmpfs={path}" for path in platform["tmpfs"]}
    flags |= {f"--device={device}" for device in platform.get("devices", [])}
    return flags


def test_every_molecule_platform_uses_the_lab_flags(root: Path):
    scenarios = sorted((root / "molecule").glob("*/molecule.yml"))
    assert scenarios
    for scenario in scenarios:
        for platform in yaml.safe_load(scenario.read_text())["platforms"]:
            assert _platform_flags(platform) == set(NODE_FLAGS), f"{scenario}: {platform['name']}"
            assert platform["command"] == "/sbin/init"
            image = "${CORECTL_CEPH_IMAGE" if platform["name"] == "ceph-server" else "${CORECTL_NODE_IMAGE"
            assert platform["image"].startswith(image)


def _molecule_nodes(root: Path):
    """molecule/plugins/nodes.py, molecule's create and destroy for every scenario."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("molecule_nodes", root / "molecule" / "plugins" / "nodes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_molecules_create_starts_each_platform_with_the_lab_flags(root: Path):
    """What molecule/plugins/nodes.py runs for each platform: the lab's flags, the platform's address on its
    scenario's network, molecule's owner label beside the stage's; a key it does not know is refused."""
    nodes = _molecule_nodes(root)
    for scenario in sorted((root / "molecule").glob("*/molecule.yml")):
        for platform in yaml.safe_load(scenario.read_text())["platforms"]:
            argv = nodes.run_argv(platform)
            pairs = {f"{flag}={value}" for flag, value in itertools.pairwise(argv) if flag.startswith("--")}
            assert set(NODE_FLAGS) <= pairs, f"{scenario}: {platform['name']}"
            assert {"--label=owner=molecule", f"--name={platform['name']}", f"--hostname={platform['name']}"} <= pairs
            assert argv[-2:] == [platform["image"], "/sbin/init"]
            for network in platform.get("networks", []):
                assert {f"--network={network['name']}", f"--ip={network['ipv4_address']}"} <= pairs
    with pytest.raises(nodes.PlatformError, match=r"does not handle \['published_ports'\]"):
        nodes.run_argv({"name": "n", "image": "i", "published_ports": ["22:22"]})


def test_image_tag_is_keyed_on_the_recipe(monkeypatch):
    tag = image.image_tag()
    assert tag == image.image_tag()
    monkeypatch.setattr(image, "PACKAGES", (*image.PACKAGES, "vim"))
    assert image.image_tag() != tag


def test_each_release_has_its_own_image_and_its_sources(monkeypatch):
    """Debian 12 and 13 images: their own tags, each one's apt sources naming its own suite; an unknown
    release is refused with the known ones named."""
    assert image.image_tag("bookworm") == image.image_tag() != image.image_tag("trixie")
    for release in ("bookworm", "trixie"):
        script = image.setup_script(release)
        assert f"deb MIRROR {release} main" in script and f"deb SECURITY {release}-security main" in script
        assert "SUITE" not in script
    with pytest.raises(CorectlError, match=r"--release sid: no such stand-in release; one of bookworm \(Debian 12\)"):
        image.image_tag("sid")


def test_a_labs_release_and_its_nodes_of_another_are_kept_in_its_spec(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "lab")
    spec = LabSpec(site=site, release="bookworm", releases={"dgx03": "trixie"})
    save_spec(spec)
    loaded = load_spec(site)
    assert (loaded.release, loaded.releases) == ("bookworm", {"dgx03": "trixie"})
    assert (loaded.release_of("dgx01"), loaded.release_of("dgx03")) == ("bookworm", "trixie")
    with pytest.raises(CorectlError, match="--release jessie: no such stand-in release") as refused:
        LabSpec(site=site, release="jessie")
    assert refused.value.exit_code == 2


def test_host_mirror_reads_deb822_sources(tmp_path: Path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n"
    )
    assert image.host_mirror(tmp_path) == "http://mirror.example/debian"
    assert image.host_mirror(tmp_path / "none") == image.DEFAULT_MIRROR


def test_lab_cluster_is_valid_and_addresses_follow_the_subnet(tmp_path: Path, root: Path):
    from corectl.site.loader import load_cluster

    site = Site(root=root, directory=tmp_path / "lab3")
    site.directory.mkdir()
    spec = LabSpec(site=site, computes=3, subnet="172.29.99.0/24", ssh_port_base=23000, ceph=True, runners=2)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBQEgpLwRj3cMTl8p2rrXIdhmmRmlx7FxKwhoixawtjS alice@lab"
    write_inventory(spec, {"nvidia_driver_repo_url": "http://172.29.99.6/nvidia"}, key)
    text = (site.directory / "cluster.yml").read_text()
    assert text.startswith("# Written by `corectl lab up`") and "# the machine's two cores" in text  # its comments
    assert yaml.safe_load(text) == lab_cluster(spec, key)
    assert yaml.safe_load((site.directory / "group_vars" / "all.yml").read_text())["nvidia_driver_repo_url"]
    cluster = load_cluster(site.directory)
    assert [n.name for n in cluster.nodes] == ["dgx01", "dgx02", "dgx03", "head01"]
    assert cluster.node("dgx03").address == "172.29.99.13"
    assert (cluster.node("dgx03").ssh_host, cluster.node("dgx03").ssh_port) == ("127.0.0.1", 23003)


def test_remove_slurm_cgroups_removes_nested_trees(tmp_path: Path):
    tree = tmp_path / "memory" / "slurm_dgx01" / "uid_0" / "job_1"
    tree.mkdir(parents=True)
    other = tmp_path / "memory" / "slurm_other"
    other.mkdir()
    assert remove_slurm_cgroups(["dgx01"], tmp_path) == 1
    assert not (tmp_path / "memory" / "slurm_dgx01").exists()
    assert other.exists()


def test_ci_digest_repeats_a_failed_stages_first_errors(tmp_path: Path, root: Path, monkeypatch):
    monkeypatch.syspath_prepend(str(root / "tests"))
    import stages

    log = tmp_path / "lab.log"
    log.write_text(
        "tests/e2e/test_lab_e2e.py EEEE\n"
        "E   AssertionError: corectl lab up exited 1:\n"
        "E   error: the lab's Ceph did not come up (failed e2e-ceph: timeout); see /x\n"
        "E   error: the lab's Ceph did not come up (failed e2e-ceph: timeout); see /x\n"
        "ok: [head01]\n"
        "ERROR tests/e2e/test_lab_e2e.py::test_provision_converges - AssertionError: corectl lab up\n"
        'fatal: [instance]: FAILED! => {"msg": "' + "x" * 400 + '"}\n'
    )
    digest = stages.first_errors(log)
    assert digest == [
        "E   error: the lab's Ceph did not come up (failed e2e-ceph: timeout); see /x",
        "ERROR tests/e2e/test_lab_e2e.py::test_provision_converges - AssertionError: corectl lab up",
        ('fatal: [instance]: FAILED! => {"msg": "' + "x" * 400 + '"}')[:600],
    ]


def test_ci_digest_names_the_task_and_message_of_ansibles_last_fatal(tmp_path: Path, root: Path, monkeypatch):
    """Molecule frames Ansible's output (colours, a box rule); a fatal the play ignores is not the failure."""
    monkeypatch.syspath_prepend(str(root / "tests"))
    import stages

    log = tmp_path / "molecule-slurm.log"
    framed = [
        "TASK [Try a refused thing] ****",
        "fatal: [slurm-c1]: FAILED! => ",
        "    msg: expected",
        "...ignoring",
        "",
        "TASK [Compare the start times",
        "  again] ****",
        "\x1b[0;31mfatal: [slurm-c2]: FAILED! => \x1b[0m",
        "    changed: false",
        "    msg: 'restarted: [slurmd 123]'",
        "",
        "PLAY RECAP ****",
    ]
    log.write_text("".join(f"  \x1b[2m\u2502\x1b[0m {line}\n" for line in framed))
    assert stages.first_errors(log) == [
        "TASK [Compare the start times again]: fatal: [slurm-c2]: FAILED! => "
        "changed: false msg: 'restarted: [slurmd 123]'"
    ]


def test_the_lanes_share_molecule_stages_and_never_run_one_scenario_on_two_releases_at_once(root: Path, monkeypatch):
    """tests/stages.py: the lanes take molecule stages from one queue (most costly scenario first); each stage
    runs once, and a scenario (its instance names, network and molecule state) is never on two releases at once."""
    import threading

    monkeypatch.syspath_prepend(str(root / "tests"))
    import stages

    running: list[tuple[str, str]] = []
    ran: list[tuple[str, str, int]] = []
    clash: list[str] = []
    guard = threading.Lock()
    another = threading.Event()

    class FakeStages:
        def molecule(self, name: str, lane: int, tag: str, release: str, ceph: str | None) -> bool:
            assert tag == f"corectl-baked:{release}", tag  # molecule's nodes start from the baked image
            assert (ceph == f"corectl-ceph:{release}") == (name in stages.CEPH_SCENARIOS), (name, ceph)
            with guard:
                if any(other == name for other, _ in running):
                    clash.append(name)
                running.append((name, release))
                ran.append((name, release, lane))
            if (name, release) == ("slurm", "bookworm"):  # the first: held until another lane took the next
                assert another.wait(30)
            else:
                another.set()
            with guard:
                running.remove((name, release))
            return not (name == "users" and release == "trixie")  # one failing stage

    class FakeImages:
        def tag(self, release: str, lane: int, kind: str = "node") -> str:
            return f"corectl-{kind}:{release}"

    queue = stages.TailQueue(FakeStages(), FakeImages(), ["users", "slurm", "zeta", "gpu"], list(stages.RELEASES))
    assert [t.key for t in queue.waiting[:3]] == ["slurm", "slurm", "gpu"] and queue.waiting[-1].key == "zeta"
    results = stages.in_parallel(*(lambda lane=lane: queue.work(lane) for lane in (1, 2, 3)))
    assert clash == []
    assert sorted((name, release) for name, release, _ in ran) == sorted(
        (name, release) for name in ("gpu", "slurm", "users", "zeta") for release in stages.RELEASES
    )
    assert ran[1][:2] == ("gpu", "bookworm")  # taken while slurm ran on bookworm: not slurm on trixie
    failed_lane = next(lane for name, release, lane in ran if (name, release) == ("users", "trixie"))
    assert results == [lane != failed_lane for lane in (1, 2, 3)]


def test_the_gated_lane_takes_a_stage_only_while_its_gate_is_open_and_goes_home_with_an_empty_queue(
    root: Path, monkeypatch
):
    """tests/stages.py: the third lane asks its gate (the machine's idle CPU) before each stage: closed, it takes
    nothing and looks again; open, it takes the tail's first stage (the Debian 13 lab); a lane whose gate never
    opens ends as soon as the other lanes have emptied the queue."""
    monkeypatch.syspath_prepend(str(root / "tests"))
    import stages

    monkeypatch.setattr(stages, "GATE_POLL_S", 0.01)
    ran: list[tuple[str, int]] = []

    def tail(key: str) -> stages.Tail:
        return stages.Tail(key, lambda lane: ran.append((key, lane)) is None)

    answers = iter([False, False])  # closed twice, then open
    queue = stages.TailQueue(None, None, [], [], [tail("lab-trixie"), tail("molecule")])  # type: ignore[arg-type]
    asked: list[bool] = []

    def gate() -> bool:
        asked.append(next(answers, True))
        return asked[-1]

    assert queue.work(3, gate=gate)
    assert ran == [("lab-trixie", 3), ("molecule", 3)] and asked[:3] == [False, False, True]

    ran.clear()
    queue = stages.TailQueue(None, None, [], [], [tail("a"), tail("b")])  # type: ignore[arg-type]
    closed = stages.in_parallel(lambda: queue.work(3, gate=lambda: False), lambda: queue.work(1))
    assert closed == [True, True] and ran == [("a", 1), ("b", 1)]


def test_a_second_head_comes_after_the_dgx_so_they_keep_their_places(tmp_path: Path, root: Path):
    """corectl lab add --head: head02 at .9, SSH 40 above the head's; the DGX keep addresses, ports and order (their
    stand-in BMCs' kinds follow their index)."""
    site = Site(root=root, directory=tmp_path / "lab")
    one = LabSpec(site=site, computes=2, subnet="172.29.99.0/24", ssh_port_base=23000)
    two = LabSpec(site=site, computes=2, subnet="172.29.99.0/24", ssh_port_base=23000, heads=2)
    assert two.nodes()[:-1] == one.nodes()
    assert two.nodes()[-1] == LabNode("head02", "172.29.99.9", 23040, True)
    assert [n["name"] for n in lab_cluster(two)["nodes"]] == ["head01", "dgx01", "dgx02"]  # declared by the operator


def test_a_stage_is_charged_the_cpu_of_every_process_it_started(tmp_path: Path, root: Path, monkeypatch):
    """tests/cpuacct.py: a stage runs in a cgroup of its own; the CPU its grandchildren burn (here about
    0.6 s, in a process that exited before the stage ended) is in the stage's figure, and one test's line
    is read back from build/cpu-tests-<stage>.tsv."""
    monkeypatch.syspath_prepend(str(root / "tests"))
    import cpuacct

    if not cpuacct.available():
        pytest.skip("no writable cgroup v1 cpuacct on this machine")
    stage = cpuacct.StageCgroup(f"harness-test-{os.getpid()}")
    stage.create()
    try:
        burn = "import time; end = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
        argv = stage.wrap(["sh", "-c", f"{sys.executable} -c '{burn}' & wait"])
        subprocess.run(argv, check=True, env={**os.environ, **stage.env()})
        used = stage.usage()
        assert 0.5 <= used.cpu < 5, used
    finally:
        stage.path.rmdir()
    tests = tmp_path / "cpu-tests-x.tsv"
    tests.write_text("test\twall_s\tuser_s\tsystem_s\tcpu_s\na::b\t3.0\t1.0\t0.5\t1.5\nc::d\t1.0\t2.0\t0.5\t2.5\n")
    assert cpuacct.read_tests(tests) == [("c::d", 1.0, 2.5), ("a::b", 3.0, 1.5)]


def test_the_ceph_fixture_image_is_keyed_by_the_playbooks_package_list(tmp_path: Path, root: Path):
    """The Ceph fixture's image holds what tests/ceph/server.yml installs, read from the playbook itself;
    its tag changes with that list and with the node image under it."""
    packages = image.ceph_packages(root)
    assert {"ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds"} <= set(packages)
    copy = tmp_path / "tests" / "ceph"
    copy.mkdir(parents=True)
    playbook = (root / "tests" / "ceph" / "server.yml").read_text()
    (copy / "server.yml").write_text(playbook)
    assert image.ceph_image_tag(tmp_path) == image.ceph_image_tag(root)
    (copy / "server.yml").write_text(playbook.replace("uuid-runtime]", "uuid-runtime, strace]"))
    assert image.ceph_image_tag(tmp_path) != image.ceph_image_tag(root)
    assert image.ceph_image_tag(root, "trixie") != image.ceph_image_tag(root)
    (copy / "server.yml").write_text(playbook.replace("Install the Ceph daemons", "Install them"))
    with pytest.raises(CorectlError, match="no task named"):
        image.ceph_packages(tmp_path)


def test_lab_replace_forgets_only_the_replaced_nodes_host_key_and_a_site_without_known_hosts_has_none_to_forget(
    tmp_path: Path, root: Path
):
    site = Site(root=root, directory=tmp_path / "lab4")
    site.directory.mkdir()
    forget_host_key(site, 23101)  # (was a traceback after the node had been replaced: FileNotFoundError)
    assert not site.known_hosts.exists()
    site.known_hosts.write_text("[127.0.0.1]:23100 ssh-ed25519 AAAA0\n[127.0.0.1]:23101 ssh-ed25519 AAAA1\n")
    forget_host_key(site, 23101)
    assert site.known_hosts.read_text() == "[127.0.0.1]:23100 ssh-ed25519 AAAA0\n"
    forget_host_key(site, 2310)  # a port that prefixes another's is another endpoint
    assert site.known_hosts.read_text() == "[127.0.0.1]:23100 ssh-ed25519 AAAA0\n"
