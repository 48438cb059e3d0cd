"""corectl.fleet.host_state: the site play's one read per node of the installed packages and of the units that are
enabled and running, which lets a converged node skip every role's install and start task."""

from __future__ import annotations

import sys

from conftest import ROOT, load_script

sys.path.insert(0, str(ROOT / "collections"))  # the module's import of module_utils, as Ansible ships them
host_state = load_script(
    "corectl_host_state", ROOT / "collections/ansible_collections/corectl/fleet/plugins/modules/host_state.py"
)

# `systemctl show -p Id -p UnitFileState -p ActiveState '*.service' '*.timer'` on a Debian 12 stand-in node (systemd
# 252), cut to the kinds it answers with: only loaded units, properties in systemd's order, a blank line between
SHOW_ALL = """\
Id=systemd-logind.service
ActiveState=active
UnitFileState=static

Id=systemd-remount-fs.service
ActiveState=active
UnitFileState=enabled-runtime

Id=apt-daily.timer
ActiveState=active
UnitFileState=enabled

Id=ssh.service
ActiveState=active
UnitFileState=enabled

Id=munge.service
ActiveState=failed
UnitFileState=enabled

Id=slurmd.service
ActiveState=activating
UnitFileState=enabled

Id=chrony.service
ActiveState=active
UnitFileState=disabled

Id=rsyslog.service
ActiveState=inactive
UnitFileState=enabled
"""


def test_only_units_enabled_and_running_are_left_alone():
    # failed (munge), stopped (rsyslog) or running but not enabled to start at boot (chrony): its start task runs;
    # static and runtime-enabled units are not the roles' to enable
    assert host_state.enabled_and_running(SHOW_ALL) == ["apt-daily.timer", "slurmd.service", "ssh.service"]


def test_the_argv_reads_every_loaded_service_and_timer_with_the_properties_read():
    argv = host_state.SHOW_ALL_ARGV
    assert argv[:2] == ["systemctl", "show"] and argv[-2:] == ["*.service", "*.timer"]
    read = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-p"}
    assert read == {"Id", "UnitFileState", "ActiveState"}


def test_only_installed_packages_count():
    # dpkg-query -W -f='${db:Status-Status} ${Package}\n': removed packages keep their configuration files
    listing = "installed munge\nconfig-files slurmd\ninstalled chrony\nhalf-installed rsyslog\ninstalled munge\n"
    assert host_state.installed(listing) == ["chrony", "munge"]


def test_the_time_zone_is_where_localtime_links_into_zoneinfo(tmp_path):
    """As timedatectl reports it: Debian links /etc/localtime to /usr/share/zoneinfo/<zone>; anything else is ""
    (the role base then runs its timezone module, which decides)."""
    linked = tmp_path / "localtime"
    linked.symlink_to("/usr/share/zoneinfo/Europe/Berlin")
    assert host_state.timezone(str(linked)) == "Europe/Berlin"
    relative = tmp_path / "relative"
    relative.symlink_to("../usr/share/zoneinfo/Etc/UTC")
    assert host_state.timezone(str(relative)) == "Etc/UTC"
    copied = tmp_path / "copied"
    copied.write_bytes(b"TZif2")
    assert host_state.timezone(str(copied)) == ""
    assert host_state.timezone(str(tmp_path / "absent")) == ""


def test_the_host_names_are_the_kernels_and_etc_hostnames():
    import socket

    names = host_state.host_names()
    assert len(names) == 2 and names[0] == socket.gethostname()
