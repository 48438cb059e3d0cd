"""secrets init, check, set-ceph-key, set-bmc, set-webhook, backup-key: the site's vault-encrypted secrets
(corectl.secrets)."""

from __future__ import annotations

from corectl import secrets
from corectl.site import Site


def init(site: Site) -> list[str]:
    """Generate what is missing, then check the whole set; the lines to print."""
    made = secrets.init(site)
    secrets.check(site)
    return [*(f"generated {item}" for item in made), f"{site.name}: secrets complete ({len(made)} generated)"]


def check(site: Site) -> str:
    secrets.check(site)
    return f"{site.name}: secrets complete"


def set_ceph_key(site: Site, client: str, key: str) -> str:
    secrets.set_ceph_key(site, client, key)
    return f"{site.name}: key for client.{client} stored (vault-encrypted)"


def set_bmc(site: Site, user: str, password: str) -> str:
    secrets.set_bmc_credentials(site, user, password)
    return f"{site.name}: BMC credentials for {user} stored (vault-encrypted)"


def set_webhook(site: Site, receiver: str, url: str) -> str:
    secrets.set_webhook(site, receiver, url)
    return f"{site.name}: webhook for alert receiver {receiver} stored (vault-encrypted)"


def backup_key(site: Site) -> str:
    return secrets.backup_public_key(site)
