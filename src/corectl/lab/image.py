"""The stand-in node image: Debian bookworm with systemd as PID 1, built without a registry.

The image tag is keyed on a hash of the recipe below, so each machine builds it once and any
change to the recipe produces a new tag (molecule and the lab always agree on the tag).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from corectl.errors import CorectlError
from corectl.lab.docker import docker, ensure_engine, image_exists

IMAGE_REPO = "corectl-node"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "python3",
    "python3-apt",
    "sudo",
    "dbus",
    "iproute2",
    "openssh-server",
)

# Runs inside the debootstrapped tree (chroot). Every container must get its own machine-id
# and SSH host keys at first boot, so the image carries neither.
SETUP_SCRIPT = r"""
set -eu
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*
cat > /etc/systemd/system/corectl-ssh-hostkeys.service <<'UNIT'
[Unit]
Description=Generate SSH host keys on first boot (corectl stand-in node)
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/corectl-ssh-hostkeys.service \
  /etc/systemd/system/multi-user.target.wants/corectl-ssh-hostkeys.service
# A console getty has no console to talk to in a container.
ln -sf /dev/null /etc/systemd/system/console-getty.service
cat > /etc/apt/sources.list <<SOURCES
deb MIRROR bookworm main
deb MIRROR bookworm-updates main
deb SECURITY bookworm-security main
SOURCES
apt-get update -qq
apt-get clean
"""


def recipe_hash() -> str:
    recipe = {"suite": SUITE, "packages": PACKAGES, "setup": SETUP_SCRIPT}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def image_tag() -> str:
    return f"{IMAGE_REPO}:{recipe_hash()}"


def host_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt already uses (images must use a reachable one)."""
    candidates = [*sorted(sources_dir.glob("sources.list.d/*.sources")), sources_dir / "sources.list"]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"(?m)^(?:URIs:|deb)\s+(\S+)", text):
            uri = match.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def ensure_image(quiet: bool = False) -> str:
    """Return the image tag, building the image first when this machine lacks it."""
    ensure_engine()
    tag = image_tag()
    if image_exists(tag):
        return tag
    if os.geteuid() != 0:
        raise CorectlError(f"building the stand-in image {tag} needs root (debootstrap)")
    if shutil.which("debootstrap") is None:
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "debootstrap"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            raise CorectlError("installing debootstrap failed; run apt-get install debootstrap")
    mirror = host_mirror()
    security = mirror.removesuffix("/debian") + "/debian-security"
    with tempfile.TemporaryDirectory(prefix="corectl-image-") as tmp:
        root = Path(tmp) / "root"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(root),
            mirror,
        ]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else None, check=False)
        if proc.returncode != 0:
            raise CorectlError(f"debootstrap of {SUITE} from {mirror} failed (exit {proc.returncode})")
        script = SETUP_SCRIPT.replace("SECURITY", security).replace("MIRROR", mirror)
        proc = subprocess.run(["chroot", str(root), "/bin/sh", "-c", script], check=False)
        if proc.returncode != 0:
            raise CorectlError("configuring the stand-in image failed (chroot setup script)")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imp = subprocess.run(
            ["docker", "import", "--change", 'CMD ["/sbin/init"]', "-", tag],
            stdin=tar.stdout,
            capture_output=True,
            check=False,
        )
        tar.stdout.close()
        tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise CorectlError(f"docker import of {tag} failed: {imp.stderr.decode().strip()}")
    docker("tag", tag, f"{IMAGE_REPO}:latest")
    return tag
