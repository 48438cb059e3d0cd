"""One command's site (issue 46): cluster.yml validated once and the inventory rendered once, handed down to
every layer the command reaches, instead of each layer loading and rendering the site again.

A command that changes the site (corectl.cli.policy.COMMAND_LOCKS: CHANGES, RECORDS) renders hosts.yml and
its lists when they are stale. A read-only command (READS) writes nothing to the site: it runs with the
inventory as last rendered, says so when cluster.yml has changed since, and stops with a one-line error when
there is none; its runs leave no run record (corectl.ansible.events.RunRequest.record).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from corectl.errors import CorectlError
from corectl.site import Site, render
from corectl.site.inventory import validate
from corectl.site.model import Cluster


def _ignore(_line: str) -> None:
    return None


@dataclass(eq=False)
class Context:
    site: Site
    writes: bool = True  # False: a read-only command, which writes nothing to the site
    warn: Callable[[str], None] = _ignore  # where a read-only command says its inventory is stale
    _cluster: Cluster | None = field(default=None, init=False, repr=False)
    _rendered: bool = field(default=False, init=False, repr=False)

    @property
    def cluster(self) -> Cluster:
        """cluster.yml, validated (the first time it is asked for: a mistake is a one-line error)."""
        if self._cluster is None:
            self._cluster = validate(self.site)
        return self._cluster

    def rendered(self) -> Cluster:
        """The cluster, once its inventory is there for a run: written when stale by a command that writes;
        as last rendered for a read-only one."""
        cluster = self.cluster
        if self._rendered:
            return cluster
        if self.writes:
            render.write(cluster, self.site.directory)
        elif not self.site.hosts_file.is_file():
            raise CorectlError(f"{self.site.hosts_file}: missing; run corectl render --inventory {self.site.name}")
        elif not render.is_current(cluster, self.site.directory):
            self.warn(
                f"warning: {self.site.hosts_file} is older than {self.site.cluster_file.name}: read with the"
                f" inventory as last rendered (corectl render --inventory {self.site.name} updates it)"
            )
        self._rendered = True
        return cluster

    def reload(self) -> Cluster:
        """After the command edited cluster.yml (add-node, remove-node): validated and rendered again."""
        self._cluster, self._rendered = None, False
        return self.rendered()
