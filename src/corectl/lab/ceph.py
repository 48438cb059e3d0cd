"""The lab's Ceph: one stand-in container running a whole Ceph cluster (tests/ceph/server.yml).

It is infrastructure beside the cluster, not a cluster node: cluster.yml only names its
monitor. Its client key is generated here and stored in the site's vault like any cephx key.
"""

from __future__ import annotations

import base64
import os
import struct
import time

from corectl import secrets
from corectl.ansible import run_standalone
from corectl.errors import CorectlError
from corectl.lab.image import ensure_ceph_image
from corectl.lab.nodes import start_container, wait_booted
from corectl.lab.spec import LabSpec

CLIENT = "corectl"
FS_NAME = "cephfs"


def container(spec: LabSpec) -> str:
    return spec.container(f"{spec.prefix}ceph")


def new_cephx_key() -> str:
    """A cephx secret in Ceph's encoding (type, creation time, length, 16 random bytes)."""
    blob = struct.pack("<HIIH", 1, int(time.time()), 0, 16) + os.urandom(16)
    return base64.b64encode(blob).decode()


def _stored_key(spec: LabSpec) -> str | None:
    return (secrets.read_values(spec.site).get(secrets.CEPH_KEYS) or {}).get(CLIENT)


def ensure(spec: LabSpec) -> str:
    """Start the Ceph container and its cluster (idempotent); return the monitor address."""
    name = container(spec)
    image = ensure_ceph_image(spec.site.root, spec.release)
    start_container(spec, f"{spec.prefix}ceph", spec.ceph_address(), image)
    wait_booted(name)
    key = _stored_key(spec) or new_cephx_key()
    inventory = {
        "ceph_server": {"hosts": {f"{spec.prefix}ceph": {"ansible_connection": "community.docker.docker",
                                                         "ansible_host": name}}}
    }  # fmt: skip
    extravars = {
        "ceph_server_address": spec.ceph_address(),
        "ceph_server_network": spec.subnet,
        "ceph_server_filesystems": [FS_NAME],
        "ceph_server_clients": [{"name": CLIENT, "key": key}],
    }
    playbook = spec.site.root / "tests" / "ceph" / "server.yml"
    result = run_standalone(playbook, inventory, extravars, spec.site, "lab ceph")
    if not result.ok:
        said = result.failure_lines() or result.output_tail(1)
        raise CorectlError(
            f"the lab's Ceph did not come up ({said[0] if said else result.status}); see {result.artifact_dir}"
        )
    secrets.set_ceph_key(spec.site, CLIENT, key)
    return spec.ceph_address()
