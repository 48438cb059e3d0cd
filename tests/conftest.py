from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import pkgutil
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cpuacct
from corectl.site import Site

# the end-to-end suite's fixtures (the lab, its first provision, the secret scan after every lab test) and the
# order of its modules: one lab per pytest process, whichever of tests/e2e's modules run
pytest_plugins = ["e2e.fixtures"]

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "standin"  # the stand-ins of NVIDIA's and GitHub's software
SAMPLES = ROOT / "tests" / "samples"  # real tool output (sources in SOURCES.md)
CHECKER = ROOT / "roles" / "node_health" / "files" / "corectl-health-check"
# the stand-in tools the health checker calls, by the name it calls them (under STANDIN)
CHECKER_TOOLS = {
    "gpu-sim": "gpusim/gpu_sim.py",
    "nvidia-smi": "driver/nvidia_smi.py",
    "nv-fabricmanager": "fabricmanager/nv_fabricmanager.py",
    "dcgmi": "dcgm/dcgmi.py",
    "nv-hostengine": "dcgm/nv_hostengine.py",
}
STANDIN_DRIVER = "580.95.05"  # the driver the simulated nodes of the host-side tests run


def load_script(name: str, path: Path) -> ModuleType:
    """A program file without a .py name (a shipped script, a stand-in tool) imported as module ``name``."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def shipped(program: Path, package: str) -> ModuleType:
    """A program the roles ship as a zipapp (tools/zipapps.py), imported from the shipped file itself: its
    package's modules' names together, as the tests name them (``hc.check_xid``, ``backup.unpack``)."""
    sys.path.insert(0, str(program))
    try:
        found = importlib.import_module(package)
        assert Path(str(found.__file__)).is_relative_to(program), found.__file__  # the zipapp's, not the source
        names = ModuleType(f"shipped_{package}")
        for module in pkgutil.iter_modules(found.__path__, f"{package}."):
            if not module.name.endswith("__main__"):
                names.__dict__.update(vars(importlib.import_module(module.name)))
        return names
    finally:
        sys.path.remove(str(program))


def closed_port() -> int:
    """A loopback TCP port nothing listens on (a connection to it is refused: no packet leaves this machine)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the socket is


def xid_catalog() -> dict[str, list[str]]:
    """NVIDIA's Xid catalog as the site ships it (group_vars/all/xid.yml), as health.json holds it."""
    import yaml

    table = yaml.safe_load((ROOT / "group_vars" / "all" / "xid.yml").read_text())["node_health_xid_catalog"]
    return {str(xid): actions for xid, actions in table.items()}


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def prod_copy(tmp_path: Path) -> Path:
    """A writable copy of inventories/prod as a site directory."""
    site = tmp_path / "prod"
    site.mkdir()
    shutil.copy(ROOT / "inventories" / "prod" / "cluster.yml", site / "cluster.yml")
    return site


def returned(key: str, host: str, value: Any) -> dict[str, Any]:
    """The stats event with which a playbook hands ``value`` back for ``host`` under ``key`` (set_stats, read by
    corectl.ansible.events.Returned): what a fake run sends its sink."""
    return {"event": "playbook_on_stats", "event_data": {"artifact_data": {key: {host: value}}}}


def probe_project(tmp_path: Path, playbook: str, hosts: tuple[str, ...] = ("localhost",)) -> Site:
    """A project of one playbook (playbooks/probe.yml) with the project's real ansible.cfg and
    collections, empty roles/ and group_vars/, and a site "probe" whose ``hosts`` are this
    machine (local connection)."""
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "roles").mkdir()
    (project / "group_vars").mkdir()
    shutil.copy(ROOT / "ansible.cfg", project / "ansible.cfg")
    (project / "collections").symlink_to(ROOT / "collections")  # corectl.fleet (Mitogen's strategy)
    (project / "playbooks" / "probe.yml").write_text(playbook)
    site = Site(root=project, directory=project / "inventories" / "probe")
    site.directory.mkdir(parents=True)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    site.hosts_file.write_text(json.dumps({"all": {"hosts": dict.fromkeys(hosts, local)}}))
    return site


# The longest test of `make check` (each README line as its own corectl process, one after the other
# on one clone: ~60 s): first, so that under pytest-xdist it never runs alone at the end while the
# other worker has nothing left to do.
LONGEST_FIRST = ("tests/unit/test_readme_commands.py::test_every_readme_line_runs_as_typed",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST ahead of the rest (the rest keep their order). Under pytest-xdist (make check:
    ``-n 2 --dist loadgroup``) the tests marked ``xdist_group`` with one name go to one worker: those that
    share a module-scoped fixture which costs seconds (the hostile corpus, Chromium's screenshot, the enroot
    build), so that it is made once and not once on each worker."""
    items.sort(key=lambda item: item.nodeid not in LONGEST_FIRST)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Inside a stage of tests/stages.py: each test's CPU (set-up and tear-down included, its stand-in
    containers included) into build/cpu-tests-<stage>.tsv; not under pytest-xdist (make check), where the
    stage's CPU is two tests' at once."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        yield
        return
    before, start = cpuacct.stage_usage_now(), time.monotonic()
    yield
    after = cpuacct.stage_usage_now()
    if before is not None and after is not None:
        cpuacct.record_test(item.nodeid, time.monotonic() - start, before, after)
