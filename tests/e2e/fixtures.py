"""The end-to-end suite's fixtures, loaded as a plugin by tests/conftest.py (one lab per pytest process, whatever
modules run): the lab's nodes (lab up), its first provision (from the bare image: every role's install path), the
provisioned lab, the container image the container tests share, the node add-node adds, and the secret scan after
every lab test. Also the order the modules run in (MODULE_ORDER).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corectl.lab.nodes import NODE_IMAGE_ENV
from e2e.lab import (
    CONSOLE,
    CONTAINER_IMAGE,
    HEAD,
    NET,
    PORT_BASE,
    SITE,
    SUBNET,
    THROUGH_JOB,
    AddedNode,
    P,
    containers,
    corectl,
    docker_exec,
    make_container_image,
    secrets_in,
    slurmd_started,
)


@pytest.fixture(scope="session")
def lab_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The lab's nodes started (corectl lab up), not provisioned yet; removed at the end."""
    site = tmp_path_factory.mktemp("sites") / SITE
    args = ["--inventory", str(site)]
    options = ["--nodes", "2", "--subnet", SUBNET, "--ssh-port-base", str(PORT_BASE), "--prefix", P]
    # an earlier run killed before its teardown (a stopped CI) leaves containers named like these:
    # this run's lab must not adopt them
    corectl("lab", "down", *args)
    corectl("lab", "up", *args, *options)
    try:
        yield site
    finally:
        corectl("lab", "down", *args)
        assert containers(site) == []


@pytest.fixture(scope="session")
def first_provision(lab_up: Path) -> Iterator[subprocess.CompletedProcess[str]]:
    """The lab's first provision (from fresh stand-ins to a working cluster). On the bare image (the default) it
    proves every role's install; tests/stages.py starts the second Debian 12 lab of `make test` from the baked
    image instead (CORECTL_LAB_NODE_IMAGE=baked: the first lab proves that install in the same run). The nodes the
    tests add from then on start from the baked image (the same Debian packages already in it:
    tests/standin/node-packages.yml, issue 45)."""
    result = corectl("provision", "--inventory", str(lab_up))
    before = os.environ.get(NODE_IMAGE_ENV)
    os.environ[NODE_IMAGE_ENV] = "baked"
    try:
        yield result
    finally:
        if before is None:
            os.environ.pop(NODE_IMAGE_ENV, None)
        else:
            os.environ[NODE_IMAGE_ENV] = before


@pytest.fixture(scope="session")
def lab(lab_up: Path, first_provision: subprocess.CompletedProcess[str]) -> Path:
    """The provisioned lab: a test that takes it (alone, with -k, or in any order) finds Slurm,
    the GPU stack, users and monitoring in place."""
    return lab_up


@pytest.fixture(scope="session")
def container_image(lab: Path) -> str:
    """The test image (Debian's base system, squashed) on both GPU nodes, made once."""
    make_container_image()
    return CONTAINER_IMAGE


@pytest.fixture(scope="session")
def added_node(lab: Path) -> AddedNode:
    """e2e-dgx03, a fresh machine (no corectl key, host key unknown, an admin user with a password
    and sudo), added with corectl add-node (bootstrap included) while a job runs on e2e-dgx01; the
    add-node test checks what that did, the remove-node test removes the node."""
    args = ["--inventory", str(lab)]
    before = [slurmd_started(c) for c in (f"corectl-{SITE}-{P}dgx01", f"corectl-{SITE}-{P}dgx02")]
    job = docker_exec(
        HEAD, "runuser", "-u", "alice", "--", "sbatch", "--parsable", f"--nodelist={P}dgx01", "--ntasks=1",
        "--mem=64", "--time=30", "--chdir=/tmp", "--output=/dev/null", "--wrap", THROUGH_JOB,
    ).strip()  # fmt: skip
    started = corectl("lab", "add", *args, "--bare").stdout
    known = (lab / "known_hosts").read_text()
    options = ["--address", f"{NET}.13", "--profile", "dgx-standin", "--leaf", "leaf1"]
    options += ["--ssh-host", "127.0.0.1", "--ssh-port", str(PORT_BASE + 3)]
    options += ["--bootstrap-user", "dgxadmin", "--password-env", "E2E_ADMIN_PASSWORD", "--yes"]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("E2E_ADMIN_PASSWORD", (lab / ".lab" / f"{P}dgx03.password").read_text().strip())
        # the vault password from the environment too, as an operator may give it (it must not be kept)
        env.setenv("CORECTL_VAULT_PASSWORD", (lab / ".vault-pass").read_text().strip())
        added = corectl("add-node", f"{P}dgx03", *args, *options).stdout
    return AddedNode(job=job, slurmd_before=before, lab_add=started, known_before=known, add_node=added)


@pytest.fixture(autouse=True)
def no_secret_left_by_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test on the provisioned lab: no secret of the site in what its commands printed or in the
    run records and fact files they wrote (each test checked on its own, in any order and alone with -k)."""
    if request.node.get_closest_marker("lab") is None or "lab" not in request.fixturenames:
        yield
        return
    since, printed = time.time() - 1, len(CONSOLE)
    yield
    lab = request.getfixturevalue("lab")
    found = secrets_in(lab, since, CONSOLE[printed:])
    assert not found, f"a secret left by {request.node.name}: {found}"


# The order the modules run in when several run in one pytest process. Each test passes alone on a fresh lab (-k);
# in one process they share the lab, and the tests that leave it changed for good run late: the nodes module adds
# and removes a DGX, the fleet module starts runner stand-ins and replaces dgx02, the head module's backup controller
# test leaves a second head in charge beside the first. Within a module, tests run in file order.
MODULE_ORDER = (
    "test_lifecycle",
    "test_jobs",
    "test_observability",
    "test_health",
    "test_fleet",
    "test_head",
    "test_nodes",
    "test_secret_scan",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The e2e modules in MODULE_ORDER (pytest would take them by file name); every other test keeps its place."""
    slots = [i for i, item in enumerate(items) if item.path.parent.name == "e2e" and item.path.stem in MODULE_ORDER]
    ordered = sorted((items[i] for i in slots), key=lambda item: MODULE_ORDER.index(item.path.stem))
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item
