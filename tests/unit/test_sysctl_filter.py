"""corectl.fleet's sysctl filters: roles base and enroot write their sysctl.d file and decide whether the live
values differ in one way (sysctl prints a multi-field value tab-separated; the roles write it with spaces)."""

from __future__ import annotations

import importlib.util

from conftest import ROOT

PLUGIN = ROOT / "collections/ansible_collections/corectl/fleet/plugins/filter/sysctl.py"
spec = importlib.util.spec_from_file_location("corectl_sysctl_filter", PLUGIN)
assert spec is not None and spec.loader is not None
sysctl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sysctl)

SETTINGS = {"vm.swappiness": 10, "net.ipv4.tcp_rmem": "4096 87380 268435456", "kernel.numa_balancing": 0}


def test_the_file_is_the_header_then_the_settings_in_name_order():
    assert sysctl.sysctl_conf(SETTINGS, "# Managed by corectl (role base)") == (
        "# Managed by corectl (role base)\n"
        "kernel.numa_balancing=0\nnet.ipv4.tcp_rmem=4096 87380 268435456\nvm.swappiness=10\n"
    )


def test_live_values_differ_only_when_a_value_does():
    # `sysctl -n kernel.numa_balancing net.ipv4.tcp_rmem vm.swappiness`: fields tab-separated
    assert not sysctl.sysctl_differs(["0", "4096\t87380\t268435456", "10"], SETTINGS)
    assert sysctl.sysctl_differs(["1", "4096\t87380\t268435456", "10"], SETTINGS)
    assert sysctl.sysctl_differs(["0", "4096\t87380\t6291456", "10"], SETTINGS)
    assert sysctl.sysctl_differs(["0", "4096 87380 268435456"], SETTINGS)  # a setting the kernel did not print
    assert set(sysctl.FilterModule().filters()) == {"sysctl_conf", "sysctl_differs"}
