"""Start and remove stand-in nodes, and write the lab site's inventory for them."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from corectl import secrets as site_secrets
from corectl import store
from corectl.errors import CorectlError
from corectl.files import atomic_write
from corectl.lab import bmc, repo
from corectl.lab.docker import LABEL, accounting_flags, docker, ensure_engine
from corectl.lab.image import ensure_baked_image, ensure_image
from corectl.lab.inventory import LAB_USER, write_inventory
from corectl.lab.spec import SPEC_FILE, LabNode, LabSpec, load_spec, save_spec
from corectl.site import Site

# The flags measured to run systemd as PID 1 here (see docs/testing.md); molecule's shared
# base config (.config/molecule/config.yml) uses the same ones, and a unit test keeps them equal.
NODE_FLAGS: tuple[str, ...] = (
    "--cap-add=SYS_ADMIN",
    "--cap-add=SYS_NICE",
    "--cap-add=NET_ADMIN",  # the firewall role's nftables rules, in the container's own network namespace
    "--security-opt=seccomp=unconfined",
    "--security-opt=apparmor=unconfined",
    "--cgroupns=host",
    "--volume=/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs=/run",
    "--tmpfs=/run/lock",
    "--device=/dev/fuse",  # ceph-fuse (no kernel ceph module here)
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# A reboot inside a node ends its systemd (exit 0): Docker starts it again, like a machine coming
# back. A container its BMC stand-in killed (power off) stays off until the BMC starts it.
RESTART_POLICY = "--restart=unless-stopped"
# Where the containers started from now on begin: the bare node image (what `corectl lab up` gives an
# operator), or with CORECTL_LAB_NODE_IMAGE=baked the image with the roles' Debian packages in it: the
# end-to-end tests set it once their lab's first provision has proven the install from the bare image, so
# the nodes they add later skip the downloads and unpacking (issue 45; tests/standin/node-packages.yml).
NODE_IMAGE_ENV = "CORECTL_LAB_NODE_IMAGE"
NODE_IMAGES = ("bare", "baked")


def ensure_key(site: Site, name: str = "id_ed25519") -> Path:
    """A key pair in the lab's .lab/ (corectl's own by default), made once."""
    key = site.lab_dir / name
    if not key.is_file():
        site.lab_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"corectl-lab-{site.name}-{name}", "-f", str(key)],
            check=True,
        )
    return key


def container_state(name: str) -> str | None:
    out = docker("ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.State}}").strip()
    return out or None


def _ensure_network(spec: LabSpec) -> None:
    existing = docker("network", "ls", "--filter", f"name=^{spec.network}$", "--format", "{{.Name}}").strip()
    if existing:
        subnet = docker(
            "network", "inspect", spec.network, "--format", "{{range .IPAM.Config}}{{.Subnet}}{{end}}"
        ).strip()
        if subnet != spec.subnet:
            raise CorectlError(
                f"docker network {spec.network} exists with subnet {subnet}, not {spec.subnet}; run corectl lab down"
            )
        return
    docker("network", "create", "--subnet", spec.subnet, "--label", f"{LABEL}={spec.site.name}", spec.network)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_container(spec: LabSpec, hostname: str, address: str, image: str, ssh_port: int | None = None) -> None:
    """Start (or restart) one of the lab's systemd containers; publish its sshd when asked."""
    name = spec.container(hostname)
    state = container_state(name)
    if state == "running":
        return
    if state is not None:
        docker("update", RESTART_POLICY, name)  # containers made before the policy was set
        docker("start", name)
        return
    publish = []
    # Docker writes /etc/hosts anew at every container start, which would lose the cluster's
    # hosts (role base) on each reboot or power cycle: the lab keeps the file on the host instead,
    # like a disk that keeps its files.
    hosts = spec.site.lab_dir / "etc-hosts" / hostname
    if not hosts.is_file():
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{address}\t{hostname}\n")
    if ssh_port is not None:
        if not _port_free(ssh_port):
            raise CorectlError(f"127.0.0.1:{ssh_port} is taken; choose another --ssh-port-base")
        publish = [f"--publish=127.0.0.1:{ssh_port}:22"]
    docker(
        "run",
        "--detach",
        f"--name={name}",
        f"--hostname={hostname}",
        f"--network={spec.network}",
        f"--ip={address}",
        *publish,
        f"--label={LABEL}={spec.site.name}",
        f"--label=corectl.node={hostname}",
        *accounting_flags(),
        *NODE_FLAGS,
        f"--volume={hosts}:/etc/hosts",
        RESTART_POLICY,
        image,
        "/sbin/init",
    )


def wait_booted(container: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = docker("exec", container, "systemctl", "is-system-running", check=False).strip()
        booted = state in ("running", "degraded")
        if booted and _exec_ok(container, "systemctl", "is-active", "--quiet", "ssh"):
            return
        time.sleep(1)
    raise CorectlError(f"{container} did not finish booting in {timeout:.0f}s (systemd state: {state or 'unknown'})")


def _exec_ok(container: str, *argv: str) -> bool:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, check=False).returncode == 0


def _ensure_gpu_devices(container: str, count: int = 8) -> None:
    """Stand-in GPUs: device nodes with NVIDIA's major number (195), as the driver creates them.

    Nothing answers behind them (opening one fails with ENXIO), but Slurm's GRES and device
    cgroup handling see real device files. /dev is rebuilt when a container starts, so every
    `lab up` makes sure they exist.
    """
    script = f"for i in $(seq 0 {count - 1}); do [ -e /dev/nvidia$i ] || mknod -m 0666 /dev/nvidia$i c 195 $i; done"
    docker("exec", container, "sh", "-c", script)


def _authorize(container: str, public_key: str) -> None:
    docker("exec", container, "install", "-d", "-m", "0700", "/root/.ssh")
    docker(
        "exec",
        "-i",
        container,
        "sh",
        "-c",
        "cat > /root/.ssh/authorized_keys && chmod 0600 /root/.ssh/authorized_keys",
        input_bytes=public_key.encode(),
    )


def _record_host_keys(spec: LabSpec) -> None:
    """known_hosts entries read out of band (docker exec), so SSH checks host keys from the start."""
    site = spec.site
    lines = []
    hosts = [*spec.nodes(), *spec.runner_hosts()]
    kept_prefixes = {f"[127.0.0.1]:{n.ssh_port} " for n in hosts}
    if site.known_hosts.is_file():
        lines = [
            line
            for line in site.known_hosts.read_text().splitlines()
            if not any(line.startswith(prefix) for prefix in kept_prefixes)
        ]
    for node in hosts:
        key = docker("exec", spec.container(node.name), "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()
        lines.append(f"[127.0.0.1]:{node.ssh_port} {key[0]} {key[1]}")
    atomic_write(site.known_hosts, ("\n".join(lines) + "\n").encode(), 0o600)


def _check_ssh(spec: LabSpec, key: Path) -> None:
    if shutil.which("ssh") is None:
        raise CorectlError("the ssh client is missing on this machine (apt-get install openssh-client)")
    for node in [*spec.nodes(), *spec.runner_hosts()]:
        for _attempt in range(10):
            proc = subprocess.run(
                [
                    "ssh", "-i", str(key), "-p", str(node.ssh_port),
                    "-o", f"UserKnownHostsFile={spec.site.known_hosts}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                    "root@127.0.0.1", "true",
                ],
                capture_output=True,
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                break
            time.sleep(1)
        else:
            detail = proc.stderr.decode(errors="replace").strip().splitlines()
            raise CorectlError(f"ssh to {node.name} (127.0.0.1:{node.ssh_port}) failed: {detail[-1] if detail else ''}")


def node_image(spec: LabSpec, node: str) -> str:
    """The image a new container of ``node`` starts from (NODE_IMAGE_ENV)."""
    kind = os.environ.get(NODE_IMAGE_ENV, "") or NODE_IMAGES[0]
    if kind not in NODE_IMAGES:
        raise CorectlError(f"{NODE_IMAGE_ENV}={kind}: one of {', '.join(NODE_IMAGES)}", exit_code=2)
    release = spec.release_of(node)
    return ensure_baked_image(spec.site.root, release) if kind == "baked" else ensure_image(release=release)


def up(spec: LabSpec) -> list[LabNode]:
    ensure_engine()
    _refuse_foreign_leftovers(spec.site)
    ensure_image(release=spec.release)
    key = ensure_key(spec.site)
    spec.site.directory.mkdir(parents=True, exist_ok=True)
    save_spec(spec)  # before any container: containers of this site without it were left by another lab
    _ensure_network(spec)
    repo_vars = repo.lab_vars(spec.container(f"{spec.prefix}repo"), spec.network, spec.repo_address(), spec.site.name)
    nodes = spec.nodes()
    _start_nodes(spec, nodes, key)
    user_key = ensure_key(spec.site, f"{LAB_USER}_ed25519").with_suffix(".pub").read_text().strip()
    write_inventory(spec, repo_vars, user_key)
    _start_bmcs(spec, nodes)
    return nodes


def _refuse_foreign_leftovers(site: Site) -> None:
    """A new lab directory whose site name is on containers already: an earlier lab's, left behind
    (its directory deleted, or its run killed). Adopting them would mix its state (Ceph, munge,
    host keys) with this lab's secrets."""
    if (site.lab_dir / SPEC_FILE).is_file():
        return
    names = lab_containers(site)
    if names:
        raise CorectlError(
            f"containers of an earlier lab named {site.name} exist ({', '.join(sorted(names))}), not made for "
            f"{site.directory}; remove them with: corectl lab down --inventory {site.directory}"
        )


def _start_bmcs(spec: LabSpec, nodes: list[LabNode]) -> None:
    """A stand-in BMC per DGX container, and its credentials in the site's vault."""
    for index, node in enumerate(spec.nodes()):
        if not node.head and node in nodes:
            bmc.start(spec.site, node.name, node.address, index, spec.container(node.name))
    try:
        stored = site_secrets.bmc_credentials(spec.site)
    except CorectlError:
        stored = None
    if stored != (bmc.USER, bmc.password(spec.site)):
        site_secrets.set_bmc_credentials(spec.site, bmc.USER, bmc.password(spec.site))


def _start_nodes(spec: LabSpec, nodes: list[LabNode], key: Path) -> None:
    public_key = key.with_suffix(".pub").read_text()
    runners = spec.runner_hosts()
    for node in [*nodes, *runners]:
        start_container(spec, node.name, node.address, node_image(spec, node.name), node.ssh_port)
    for node in [*nodes, *runners]:
        container = spec.container(node.name)
        wait_booted(container)
        _authorize(container, public_key)
        if not node.head and node not in runners:
            _ensure_gpu_devices(container)
    _record_host_keys(spec)
    _check_ssh(spec, key)


BARE_ADMIN = "dgxadmin"


def add(site: Site, bare: bool = False, head: bool = False, release: str | None = None) -> LabNode:
    """Start one more DGX stand-in beside a running lab (not declared anywhere: see corectl add-node).

    ``bare``: like a freshly installed machine: corectl's key is not installed and its host key not
    recorded; an admin user (dgxadmin, sudo) has a random password kept in .lab/<node>.password, for
    `corectl bootstrap`. ``head``: the second head stand-in instead (head02; one at most). ``release``:
    its Debian release when not the lab's (a node of another OS generation).
    """
    ensure_engine()
    spec = load_spec(site)
    if head and spec.heads > 1:
        raise CorectlError(f"lab {site.name} has its second head already", exit_code=2)
    spec = replace(spec, heads=2) if head else replace(spec, computes=spec.computes + 1)
    node = [n for n in spec.nodes() if n.head == head][-1]
    if release is not None and release != spec.release:
        spec = replace(spec, releases={**spec.releases, node.name: release})
    if bare:
        _start_bare(spec, node)
    else:
        _start_nodes(spec, [node], ensure_key(site))
    _start_bmcs(spec, [node])
    save_spec(spec)
    return node


def _start_bare(spec: LabSpec, node: LabNode) -> None:
    """A stand-in like a freshly installed machine: no corectl key, an admin user with a password in .lab/."""
    container = spec.container(node.name)
    start_container(spec, node.name, node.address, node_image(spec, node.name), node.ssh_port)
    wait_booted(container)
    if not node.head:
        _ensure_gpu_devices(container)
    password = secrets.token_urlsafe(18)
    docker("exec", container, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", BARE_ADMIN)
    docker("exec", "-i", container, "chpasswd", input_bytes=f"{BARE_ADMIN}:{password}\n".encode())
    atomic_write(spec.site.lab_dir / f"{node.name}.password", (password + "\n").encode(), 0o600)


def replace_node(site: Site, name: str) -> LabNode:
    """A declared node's machine replaced by a blank one with its name and address (a head whose disk died): the
    old container goes with its disk, the new one is bare (see add), and its old host key is forgotten (what an
    operator does with ssh-keygen -R before bootstrapping the new machine)."""
    ensure_engine()
    spec = load_spec(site)
    node = next((n for n in spec.nodes() if n.name == name), None)
    if node is None:
        raise CorectlError(f"{name} is not a node of lab {site.name} ({', '.join(n.name for n in spec.nodes())})")
    container = spec.container(name)
    if container_state(container) is not None:
        docker("rm", "--force", "--volumes", container)
    (spec.site.lab_dir / "etc-hosts" / name).unlink(missing_ok=True)  # the old disk's /etc/hosts
    _start_bare(spec, node)
    forget_host_key(site, node.ssh_port)
    return node


def forget_host_key(site: Site, port: int) -> None:
    """Drop the site's known_hosts entry for the lab endpoint 127.0.0.1:``port`` (ssh-keygen -R); a site without
    known_hosts has nothing to forget, and gets none."""
    if not site.known_hosts.is_file():
        return
    endpoint = f"[127.0.0.1]:{port} "
    kept = [line for line in site.known_hosts.read_text().splitlines() if not line.startswith(endpoint)]
    atomic_write(site.known_hosts, ("\n".join(kept) + "\n").encode(), 0o600)


def lab_containers(site: Site) -> list[str]:
    """Every container labelled with the site's name, running or not (the nodes, Ceph, the repository)."""
    return docker("ps", "-a", "--filter", f"label={LABEL}={site.name}", "--format", "{{.Names}}").split()


def running_nodes(site: Site) -> list[str]:
    out = docker("ps", "-a", "--filter", f"label={LABEL}={site.name}", "--format", '{{.Label "corectl.node"}}')
    return sorted(line for line in out.split() if line)


def remove_slurm_cgroups(node_names: list[str], cgroup_root: Path = CGROUP_ROOT) -> int:
    """Slurm in a --cgroupns=host container leaves /slurm_<node> trees in the host's cgroups."""
    removed = 0
    for name in node_names:
        for tree in cgroup_root.glob(f"*/slurm_{name}"):
            remove_cgroup_tree(tree)
            removed += 1
    return removed


def remove_cgroup_tree(tree: Path) -> None:
    """A cgroup and every cgroup below it, deepest first (a cgroup's files go with its directory)."""
    for directory in sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        directory.rmdir()
    tree.rmdir()


def down(site: Site) -> list[str]:
    ensure_engine()
    names = running_nodes(site)
    containers = lab_containers(site)
    bmc.stop_all(site, set(containers))
    if containers:
        docker("rm", "--force", "--volumes", *containers)
    networks = docker("network", "ls", "-q", "--filter", f"label={LABEL}={site.name}").split()
    if networks:
        docker("network", "rm", *networks)
    remove_slurm_cgroups(names)
    forget_machines(site)
    return names


def forget_machines(site: Site) -> None:
    """The fact cache, the run records and the site's store (its runs' index, history and the marks that say the
    site has run before) describe machines that are gone: the next lab up is a new cluster, whose first provision
    must start slurmctld and slurmdbd on their empty state (role slurm holds them on a site that has run before, as
    for a replaced head)."""
    for kept in (site.facts_dir, site.runs_dir):
        if kept.is_dir():
            shutil.rmtree(kept)
    store.remove(site)
