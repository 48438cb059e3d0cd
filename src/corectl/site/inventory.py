"""A site's cluster.yml validated and rendered into its inventory (the first step of every run),
and cluster.yml's JSON Schema."""

from __future__ import annotations

import json

from corectl.errors import CorectlError
from corectl.site import Site, render, require_cluster_file
from corectl.site.loader import load_cluster
from corectl.site.model import Cluster, ClusterConfig


def validate(site: Site) -> Cluster:
    require_cluster_file(site)
    return load_cluster(site.directory, display_root=site.root)


def render_site(site: Site, check_only: bool) -> tuple[Cluster, bool]:
    """Return the cluster and whether hosts.yml changed (or, with check_only, is stale)."""
    cluster = validate(site)
    if check_only:
        stale = not render.is_current(cluster, site.directory)
        if stale:
            raise CorectlError(f"{site.hosts_file}: stale or missing; run corectl render --inventory {site.name}")
        return cluster, False
    return cluster, render.write(cluster, site.directory)


def schema() -> str:
    document = ClusterConfig.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "corectl cluster.yml"
    return json.dumps(document, indent=2, sort_keys=True)
