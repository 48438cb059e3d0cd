"""The lab as `corectl lab up` was asked for it (nodes, addresses, ports, releases), and where it is kept
(.lab/spec.json): what every other lab command starts from."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field

from corectl.errors import CorectlError
from corectl.lab.image import DEFAULT_RELEASE, check_release
from corectl.site import Site


@dataclass(frozen=True)
class LabNode:
    name: str
    address: str
    ssh_port: int
    head: bool


@dataclass(frozen=True)
class LabSpec:
    site: Site
    computes: int = 2
    subnet: str = "172.29.10.0/24"
    ssh_port_base: int = 22100
    # Slurm puts job cgroups in the host's tree as /slurm_<node>: two labs on one machine need
    # different node names (the end-to-end test uses its own prefix).
    prefix: str = ""
    # a stand-in Ceph cluster beside the nodes, mounted with ceph-fuse at /shared
    ceph: bool = False
    # runner host stand-ins (cluster.yml control.runners): runs fan out over them; a rack per DGX
    runners: int = 0
    # head stand-ins: head02 (address .9) is a second head for a backup controller (corectl lab add --head)
    heads: int = 1
    # the Debian release of the lab's stand-ins (corectl lab image --release), and of nodes added
    # with another one (corectl lab add --release): node name -> release
    release: str = DEFAULT_RELEASE
    releases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            ipaddress.IPv4Network(self.subnet)
        except ValueError:
            raise CorectlError(
                f"--subnet {self.subnet}: not an IPv4 network such as 172.29.10.0/24", exit_code=2
            ) from None
        if not 1024 <= self.ssh_port_base <= 65535 - 64:
            raise CorectlError(f"--ssh-port-base {self.ssh_port_base}: choose a port from 1024 to 65471", exit_code=2)
        for release in (self.release, *self.releases.values()):
            check_release(release)

    def release_of(self, node: str) -> str:
        return self.releases.get(node, self.release)

    @property
    def network(self) -> str:
        return f"corectl-{self.site.name}"

    def ceph_address(self) -> str:
        return str(ipaddress.IPv4Network(self.subnet).network_address + 5)

    def repo_address(self) -> str:
        """The stand-in package repository's server (tests/standin)."""
        return str(ipaddress.IPv4Network(self.subnet).network_address + 6)

    def container(self, node: str) -> str:
        return f"corectl-{self.site.name}-{node}"

    def nodes(self) -> list[LabNode]:
        net = ipaddress.IPv4Network(self.subnet)
        if net.num_addresses < 16 + self.computes:
            raise CorectlError(f"--subnet {self.subnet} is too small for {self.computes + 1} nodes")
        out = [LabNode(f"{self.prefix}head01", str(net.network_address + 10), self.ssh_port_base, True)]
        for i in range(1, self.computes + 1):
            name = f"{self.prefix}dgx{i:02d}"
            out.append(LabNode(name, str(net.network_address + 10 + i), self.ssh_port_base + i, False))
        if self.heads > 1:  # last: the DGX keep their places (their BMCs' kinds follow them)
            out.append(LabNode(f"{self.prefix}head02", str(net.network_address + 9), self.ssh_port_base + 40, True))
        return out

    def runner_hosts(self) -> list[LabNode]:
        """Runner stand-ins: addresses from .40, SSH published 50 ports above the head's."""
        net = ipaddress.IPv4Network(self.subnet)
        return [
            LabNode(f"{self.prefix}runner{i}", str(net.network_address + 40 + i), self.ssh_port_base + 50 + i, False)
            for i in range(1, self.runners + 1)
        ]


SPEC_FILE = "spec.json"


def save_spec(spec: LabSpec) -> None:
    keys = ("computes", "subnet", "ssh_port_base", "prefix", "ceph", "runners", "heads", "release", "releases")
    data = {k: getattr(spec, k) for k in keys}
    spec.site.lab_dir.mkdir(parents=True, exist_ok=True)
    (spec.site.lab_dir / SPEC_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_spec(site: Site) -> LabSpec:
    try:
        data = json.loads((site.lab_dir / SPEC_FILE).read_text())
    except (OSError, ValueError):
        raise CorectlError(f"no lab is up for site {site.name}; run corectl lab up --inventory {site.name}") from None
    return LabSpec(site=site, **data)
