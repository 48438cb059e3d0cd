"""corectl upgrade os: what corectl.fleet.os_updates reads from apt-get's simulation, what it leaves out, the kernel
check that keeps a node from rebooting into a kernel without NVIDIA modules, the rollout order and the record."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from corectl.ansible.events import RECORD_KEY, Tally
from corectl.commands.upgrade import chosen_nodes, rollout_order
from corectl.errors import CorectlError

sys.path.insert(0, str(ROOT / "collections"))  # the module's own module_utils, as Ansible ships them with it
from ansible_collections.corectl.fleet.plugins.module_utils import apt_plan

MODULE = ROOT / "collections/ansible_collections/corectl/fleet/plugins/modules/os_updates.py"
spec = importlib.util.spec_from_file_location("corectl_os_updates", MODULE)
assert spec is not None and spec.loader is not None
os_updates = importlib.util.module_from_spec(spec)
spec.loader.exec_module(os_updates)

# apt-get -s --with-new-pkgs upgrade on a Debian 12 node (lines of the form apt prints; the Conf lines follow)
SIMULATION = """\
Reading package lists...
Building dependency tree...
Calculating upgrade...
The following NEW packages will be installed:
  linux-image-6.1.0-30-amd64
The following packages will be upgraded:
  base-files libssl3 linux-image-amd64 slurmd
Inst base-files [12.4+deb12u8] (12.4+deb12u9 Debian:12.9/stable [amd64])
Inst libssl3 [3.0.15-1~deb12u1] (3.0.16-1~deb12u1 Debian-Security:12/stable-security [amd64])
Inst linux-image-6.1.0-30-amd64 (6.1.124-1 Debian-Security:12/stable-security [amd64])
Inst linux-image-amd64 [6.1.119-1] (6.1.124-1 Debian-Security:12/stable-security [amd64])
Inst slurmd [22.05.8-4+deb12u2] (22.05.8-4+deb12u3 Debian-Security:12/stable-security [amd64])
Conf base-files (12.4+deb12u9 Debian:12.9/stable [amd64])
"""
EXCLUDE = ["slurm*", "libslurm*", "nvidia-*"]


def test_the_simulation_is_read_per_package_with_versions_before_and_after():
    updates = apt_plan.parse_simulation(SIMULATION)
    assert [u.name for u in updates] == [
        "base-files", "libssl3", "linux-image-6.1.0-30-amd64", "linux-image-amd64", "slurmd"
    ]  # fmt: skip
    assert updates[1].as_dict() == {"name": "libssl3", "before": "3.0.15-1~deb12u1", "after": "3.0.16-1~deb12u1"}
    assert updates[2].before == ""  # a new kernel, pulled by its meta package
    assert [u.security for u in updates] == [False, True, True, True, True]


def test_what_corectl_pins_is_left_out_and_security_only_keeps_security_updates():
    updates = apt_plan.parse_simulation(SIMULATION)
    chosen, left = apt_plan.select(updates, EXCLUDE, security_only=False)
    assert [u.name for u in left] == ["slurmd"]
    assert "base-files" in [u.name for u in chosen]
    chosen, left = apt_plan.select(updates, EXCLUDE, security_only=True)
    assert [u.name for u in chosen] == ["libssl3", "linux-image-6.1.0-30-amd64", "linux-image-amd64"]
    assert [u.name for u in left] == ["base-files", "slurmd"]
    assert apt_plan.matches("libslurm38:amd64", EXCLUDE)


def test_only_keeps_the_named_packages_and_an_install_that_would_touch_others_is_named():
    updates = apt_plan.parse_simulation(SIMULATION)
    chosen, left = apt_plan.select(updates, [], security_only=False, only=["slurm*", "libslurm*"])
    assert [u.name for u in chosen] == ["slurmd"]  # corectl upgrade slurm's selection
    assert "libssl3" in [u.name for u in left]
    assert apt_plan.outside(updates, [], ["slurm*"]) == [
        "base-files", "libssl3", "linux-image-6.1.0-30-amd64", "linux-image-amd64"
    ]  # fmt: skip
    assert apt_plan.outside(updates, EXCLUDE) == ["slurmd"]  # corectl upgrade os's refusal


def test_kernels_and_their_nvidia_modules():
    assert apt_plan.kernels_from_boot(
        ["vmlinuz-6.1.0-30-amd64", "config-6.1.0-30-amd64", "vmlinuz-", "initrd.img"]
    ) == ["6.1.0-30-amd64"]
    dkms = ["/lib/modules/6.1.0-30-amd64/updates/dkms/nvidia.ko.xz", "/lib/modules/6.1.0-30-amd64/kernel/fs/ext4.ko"]
    assert apt_plan.has_module(dkms, "nvidia")
    precompiled = ["/lib/modules/6.8.0-51-generic/kernel/nvidia-580srv/nvidia.ko"]
    assert apt_plan.has_module(precompiled, "nvidia")
    assert not apt_plan.has_module(["/lib/modules/6.1.0-31-amd64/updates/dkms/nvidia-uvm.ko"], "nvidia")
    assert not apt_plan.has_module([], "nvidia")


class FakeModule:
    """What the module's kernel helpers need from AnsibleModule: dpkg's version order (real dpkg)."""

    def run_command(self, argv: list[str], **_: object) -> tuple[int, str, str]:
        import subprocess

        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr


@pytest.mark.skipif(not Path("/usr/bin/dpkg").exists(), reason="dpkg orders Debian versions")
def test_the_next_kernel_is_the_newest_installed_by_debian_version_order(monkeypatch: pytest.MonkeyPatch):
    boot = ["vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-30-amd64", "vmlinuz-6.1.0-28-amd64"]
    monkeypatch.setattr(os_updates.os, "listdir", lambda _path: boot)
    assert os_updates.next_kernel(FakeModule(), "6.1.0-28-amd64") == "6.1.0-30-amd64"
    assert os_updates.next_kernel(FakeModule(), "6.1.0-30-amd64") == ""  # the newest runs: nothing new boots


def test_the_reboot_marker_and_who_asked(tmp_path: Path):
    marker = str(tmp_path / "reboot-required")
    assert os_updates.reboot_state(marker) == (False, [])
    os_updates.note_reboot(marker, ["linux-image-6.1.0-30-amd64"])
    os_updates.note_reboot(marker, ["libc6"])
    assert os_updates.reboot_state(marker) == (True, ["libc6", "linux-image-6.1.0-30-amd64"])


def test_services_held_answers_101_to_every_start_for_the_install_and_puts_a_sites_policy_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import subprocess

    policy = tmp_path / "policy-rc.d"
    monkeypatch.setattr(os_updates, "POLICY_RC_D", str(policy))
    with os_updates.services_held(True):  # corectl upgrade slurm: the daemons restart in SchedMD's order after
        assert subprocess.run([str(policy), "slurmd", "restart"], check=False).returncode == 101
    assert not policy.exists()
    policy.write_text("#!/bin/sh\nexit 0\n")  # a site's own
    with os_updates.services_held(True):
        assert "exit 101" in policy.read_text()
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"
    with os_updates.services_held(False):  # corectl upgrade os: the packages' own restarts
        assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_held_spares_go_first_then_idle_then_busy_nodes():
    order = rollout_order(["dgx01", "dgx02", "dgx03", "dgx04"], busy={"dgx01"}, spares={"dgx04"})
    assert order == ["dgx04", "dgx02", "dgx03", "dgx01"]


def test_an_unknown_node_in_limit_is_refused_with_exit_2():
    assert chosen_nodes("lab", ["dgx01", "dgx02"], "compute nodes", "dgx02") == ["dgx02"]
    with pytest.raises(CorectlError) as refused:
        chosen_nodes("lab", ["dgx01", "dgx02"], "compute nodes", "dgx[02-03]")
    assert refused.value.exit_code == 2 and "not compute nodes of site lab: dgx03" in str(refused.value)


def test_the_versions_a_playbook_hands_back_reach_the_run_record():
    tally = Tally()
    packages = [{"name": "libssl3", "before": "3.0.15-1~deb12u1", "after": "3.0.16-1~deb12u1"}]
    tally(
        {"event": "playbook_on_stats", "event_data": {"artifact_data": {RECORD_KEY: {"dgx01": {"packages": packages}}}}}
    )
    assert tally.recorded == {"dgx01": {"packages": packages}}
