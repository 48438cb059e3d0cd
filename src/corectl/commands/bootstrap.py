"""bootstrap: the per-node loop and its summary (the SSH work is in corectl.bootstrap)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from corectl import hostlist
from corectl.bootstrap import Login, Outcome, bootstrap_node, public_key
from corectl.commands.inventory import render_site
from corectl.errors import CorectlError
from corectl.site import Site


def bootstrap(
    site: Site, console: Console, nodes: list[str], login: Login, accept: Callable[[str, str], bool]
) -> list[Outcome]:
    cluster, _ = render_site(site, check_only=False)
    try:
        wanted = [name for expr in nodes for name in hostlist.expand(expr)] or [n.name for n in cluster.nodes]
    except hostlist.HostlistError as exc:
        raise CorectlError(f"NODE: {exc}", exit_code=2) from None
    known = {n.name for n in cluster.nodes}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise CorectlError(f"not nodes of site {site.name}: {', '.join(unknown)}", exit_code=2)
    pub = public_key(site, cluster)
    target = cluster.config.cluster.ssh.user
    outcomes = []
    for name in wanted:
        node = cluster.node(name)
        outcomes.append(bootstrap_node(site, node, login, pub, node.ssh_user or target, accept))
    table = Table(title=f"bootstrap {site.name}")
    for column in ("node", "host key", "key recorded", "corectl key", "python3"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(
            o.node,
            o.fingerprint,
            "new" if o.new_host_key else "known",
            "installed" if o.key_installed else "present",
            "installed" if o.python_installed else "present",
        )
    console.print(table)
    return outcomes
