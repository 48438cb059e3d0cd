"""The lab's commands: lab up, down, image, add, repo (the stand-in cluster on this machine)."""

from __future__ import annotations

from typing import Annotated

import typer

from corectl.cli import options, policy
from corectl.cli.app import lab_app, out
from corectl.cli.options import LabInventoryOpt, WaitOpt
from corectl.errors import CorectlError


@lab_app.command("up")
def lab_up(
    inventory: LabInventoryOpt = "lab",
    nodes: Annotated[int, typer.Option("--nodes", "-n", min=1, max=32, help="DGX stand-ins beside the head")] = 2,
    subnet: Annotated[str, typer.Option(help="private docker network for the nodes")] = "172.29.10.0/24",
    ssh_port_base: Annotated[int, typer.Option(help="head's sshd on 127.0.0.1:BASE, dgxNN on BASE+NN")] = 22100,
    prefix: Annotated[str, typer.Option(help="node name prefix (two labs on one machine need distinct names)")] = "",
    ceph: Annotated[bool, typer.Option("--ceph/--no-ceph", help="a stand-in Ceph cluster, mounted at /shared")] = True,
    runners: Annotated[
        int, typer.Option(min=0, max=8, help="runner host stand-ins; runs fan out over them, a rack per DGX")
    ] = 0,
    release: options.ReleaseOpt = "bookworm",
    wait: WaitOpt = 0,
) -> None:
    """Start a head node and N DGX stand-ins and write the lab inventory for them."""
    from corectl.commands.lab import LabSpec, up_lines
    from corectl.commands.lab import lab_up as start

    site = policy.site(inventory)
    spec = LabSpec(
        site=site,
        computes=nodes,
        subnet=subnet,
        ssh_port_base=ssh_port_base,
        prefix=prefix,
        ceph=ceph,
        runners=runners,
        release=release,
    )
    site.directory.mkdir(parents=True, exist_ok=True)  # a new lab's site: locked like any other
    with policy.changing(site, wait):
        started, ceph_address = start(spec)
    for line in up_lines(spec, started, ceph_address, inventory):
        out.print(line)


@lab_app.command("down")
def lab_down(inventory: LabInventoryOpt = "lab", wait: WaitOpt = 0) -> None:
    """Remove the lab's containers, network, cgroup leftovers, cached facts and run records."""
    from corectl.commands.lab import down

    site = policy.site(inventory)
    with policy.changing(site, wait):
        removed = down(site)
    out.print(f"lab '{site.name}' removed ({len(removed)} nodes)")


@lab_app.command("image")
def lab_image(
    release: options.ReleaseOpt = "bookworm",
    ceph: Annotated[bool, typer.Option("--ceph", help="the lab's Ceph fixture's image (on the node image)")] = False,
    baked: Annotated[
        bool,
        typer.Option("--baked", help="the node image with every Debian package the roles install"),
    ] = False,
) -> None:
    """Build the stand-in node image of a Debian release if missing (starting Docker if needed); print its tag."""
    from corectl.commands.lab import ensure_baked_image, ensure_ceph_image, ensure_image
    from corectl.site import project_root

    if ceph and baked:
        raise CorectlError("--ceph and --baked: choose one image", exit_code=2)
    if ceph:
        out.print(ensure_ceph_image(project_root(), release))
    elif baked:
        out.print(ensure_baked_image(project_root(), release))
    else:
        out.print(ensure_image(release=release))


@lab_app.command("replace")
def lab_replace(
    node: Annotated[str, typer.Argument(help="a node of the lab, e.g. e2e-head01")],
    inventory: LabInventoryOpt = "lab",
    wait: WaitOpt = 0,
) -> None:
    """Replace a lab node's machine by a blank one (same name and address; its disk, corectl's key and its host
    key gone; admin user dgxadmin, password in .lab/): a head whose disk died, for corectl restore."""
    from corectl.commands.lab import replace_node

    site = policy.site(inventory)
    with policy.changing(site, wait):
        new = replace_node(site, node)
    out.print(f"{new.name:8} {new.address:15} ssh 127.0.0.1:{new.ssh_port} (blank)")
    out.print(
        f"next: corectl bootstrap {new.name} --inventory {inventory} --user dgxadmin --password-env VAR",
        highlight=False,
        soft_wrap=True,
    )


@lab_app.command("add")
def lab_add(
    inventory: LabInventoryOpt = "lab",
    bare: Annotated[
        bool,
        typer.Option("--bare", help="like a fresh machine: no corectl key; admin user dgxadmin (password in .lab/)"),
    ] = False,
    head: Annotated[
        bool, typer.Option("--head", help="a second head stand-in (head02, for slurm.backup_controller)")
    ] = False,
    release: options.NodeReleaseOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Start one more DGX stand-in (or a second head) beside a running lab (declare it with corectl add-node)."""
    from corectl.commands.lab import add

    site = policy.site(inventory)
    with policy.changing(site, wait):
        node = add(site, bare=bare, head=head, release=release)
    out.print(f"{node.name:8} {node.address:15} ssh 127.0.0.1:{node.ssh_port}")
    if head:
        out.print(f"next: declare {node.name} in cluster.yml (profile head-standin) as slurm.backup_controller")
        return
    out.print(
        f"next: corectl add-node {node.name} --inventory {inventory} --address {node.address} "
        f"--profile dgx-standin --leaf leaf1 --ssh-host 127.0.0.1 --ssh-port {node.ssh_port}",
        highlight=False,
        soft_wrap=True,
    )


@lab_app.command("repo")
def lab_repo(
    name: Annotated[str, typer.Option(help="container name")],
    network: Annotated[str, typer.Option(help="docker network to serve on")] = "",
    address: Annotated[str, options.address("the server's address on that network")] = "",
    stop: Annotated[bool, typer.Option("--stop", help="remove the server instead")] = False,
) -> None:
    """Serve the stand-in package repository (tests/standin) on a test network; print its URL."""
    from corectl.commands.lab import repo_serve, repo_stop

    if stop:
        repo_stop(name)
        return
    if not network or not address:
        raise CorectlError("lab repo: --network and --address are required to serve", exit_code=2)
    out.print(repo_serve(name, network, address))
