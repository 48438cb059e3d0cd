"""The stand-in node images: Debian 12 (bookworm) or 13 (trixie) with systemd as PID 1, built
without a registry (debootstrap).

Each release's image tag is keyed on a hash of its recipe below, so each machine builds it once
and any change to the recipe produces a new tag (molecule and the lab always agree on the tag).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from corectl.errors import CorectlError
from corectl.lab.docker import accounting_flags, docker, ensure_engine, image_exists

IMAGE_REPO = "corectl-node"
# The Debian releases a stand-in node can run, by debootstrap's suite name; the first is the default
RELEASES = {"bookworm": "Debian 12", "trixie": "Debian 13"}
DEFAULT_RELEASE = next(iter(RELEASES))
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
    "eatmydata",  # test speed only: dpkg in the stand-ins runs under it (SETUP_SCRIPT)
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
# Some host kernels (measured here: 6.18) number mount namespaces from per-CPU batches and
# refuse to bind-mount a namespace numbered below the caller's own (their namespace loop check:
# EINVAL). Slurm's job_container/tmpfs binds every job's new namespace, so every job whose
# namespace is made on a CPU whose batch lies below this container's namespace fails to start.
# At boot, before slurmd, namespaces are made on each such CPU until it draws a new batch
# (numbered above every namespace that exists): from then on every job's binds.
cat > /usr/local/sbin/corectl-standin-nsid <<'SCRIPT'
#!/bin/sh
set -u
dir=/run/corectl-nsid
mkdir -p "$dir/bind"
mount --bind "$dir/bind" "$dir/bind" || exit 0
touch "$dir/bind/ns"
bindable() {  # can a mount namespace made on CPU $1 be bound here?
  rm -f "$dir/ready"
  taskset -c "$1" unshare -m sh -c "touch $dir/ready; exec sleep 60" &
  holder=$!
  while [ ! -e "$dir/ready" ]; do
    kill -0 "$holder" 2>/dev/null || return 1
    sleep 0.05
  done
  ok=1
  if mount --bind "/proc/$holder/ns/mnt" "$dir/bind/ns" 2>/dev/null; then
    umount "$dir/bind/ns"
    ok=0
  fi
  kill "$holder"
  wait "$holder" 2>/dev/null
  return $ok
}
last=$(($(getconf _NPROCESSORS_CONF) - 1))
for cpu in $(seq 0 "$last"); do
  taskset -c "$cpu" true 2>/dev/null || continue
  made=0
  until bindable "$cpu"; do
    if [ "$made" -ge 16384 ]; then
      echo "cpu $cpu: namespaces made there still cannot be bound" >&2
      break
    fi
    taskset -c "$cpu" sh -c 'i=0; while [ $i -lt 256 ]; do unshare -m true; i=$((i + 1)); done'
    made=$((made + 256))
  done
  echo "cpu $cpu: bindable after $made new namespaces"
done
umount "$dir/bind"
rm -rf "$dir"
SCRIPT
chmod 0755 /usr/local/sbin/corectl-standin-nsid
cat > /etc/systemd/system/corectl-standin-nsid.service <<'UNIT'
[Unit]
Description=Mount namespaces that Slurm's job_container/tmpfs can bind (corectl stand-in node)
Before=slurmd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/corectl-standin-nsid

[Install]
WantedBy=slurmd.service
UNIT
# Only where slurmd runs (its first start by role slurm, and every boot after): on the other
# stand-ins (the head, Ceph, molecule's other scenarios) it was only CPU spent at each boot.
mkdir -p /etc/systemd/system/slurmd.service.wants
ln -sf /etc/systemd/system/corectl-standin-nsid.service \
  /etc/systemd/system/slurmd.service.wants/corectl-standin-nsid.service
# Test speed, in the stand-in images only (never in roles; a real node keeps dpkg's own safety):
# dpkg unpacks without fsync (force-unsafe-io) and apt runs it under eatmydata (its database,
# maintainer scripts and triggers skip fsync too); daemons are started by systemd, without it.
# A container's files live in the host's page cache: only a crash of this machine could lose
# them, and no test outlives that. No documentation, manual pages or translations are unpacked.
cat > /etc/dpkg/dpkg.cfg.d/corectl-standin <<'CFG'
force-unsafe-io
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
CFG
cat > /usr/local/sbin/corectl-standin-dpkg <<'SCRIPT'
#!/bin/sh
exec /usr/bin/eatmydata /usr/bin/dpkg "$@"
SCRIPT
chmod 0755 /usr/local/sbin/corectl-standin-dpkg
echo 'Dir::Bin::dpkg "/usr/local/sbin/corectl-standin-dpkg";' > /etc/apt/apt.conf.d/90corectl-standin
find /usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
rm -rf /usr/share/man/* /usr/share/info/*
find /usr/share/locale -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
# A console getty has no console to talk to in a container.
ln -sf /dev/null /etc/systemd/system/console-getty.service
cat > /etc/apt/sources.list <<SOURCES
deb MIRROR SUITE main
deb MIRROR SUITE-updates main
deb SECURITY SUITE-security main
SOURCES
apt-get update -qq
apt-get clean
"""


def check_release(release: str) -> str:
    if release not in RELEASES:
        known = ", ".join(f"{name} ({what})" for name, what in RELEASES.items())
        raise CorectlError(f"--release {release}: no such stand-in release; one of {known}", exit_code=2)
    return release


def setup_script(release: str) -> str:
    return SETUP_SCRIPT.replace("SUITE", check_release(release))


def recipe_hash(release: str = DEFAULT_RELEASE) -> str:
    recipe = {"suite": release, "packages": PACKAGES, "setup": setup_script(release)}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def image_tag(release: str = DEFAULT_RELEASE) -> str:
    return f"{IMAGE_REPO}:{recipe_hash(release)}"


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


STDERR_FD = 2


def ensure_image(quiet: bool = False, release: str = DEFAULT_RELEASE) -> str:
    """Return the release's image tag, building the image first when this machine lacks it."""
    tag = image_tag(release)
    ensure_engine()
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
            release,
            str(root),
            mirror,
        ]
        # the build's progress goes to this command's stderr (or nowhere, quiet): its stdout is the command's own
        # result (`lab add` prints the node it started, `lab image` the tag), which scripts read
        progress = subprocess.DEVNULL if quiet else STDERR_FD
        proc = subprocess.run(cmd, stdout=progress, check=False)
        if proc.returncode != 0:
            raise CorectlError(f"debootstrap of {release} from {mirror} failed (exit {proc.returncode})")
        script = setup_script(release).replace("SECURITY", security).replace("MIRROR", mirror)
        proc = subprocess.run(["chroot", str(root), "/bin/sh", "-c", script], stdout=progress, check=False)
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
    docker("tag", tag, f"{IMAGE_REPO}:{release}")
    if release == DEFAULT_RELEASE:
        docker("tag", tag, f"{IMAGE_REPO}:latest")
    return tag


# The lab's Ceph fixture (tests/ceph/server.yml) is infrastructure beside the stand-in nodes, not a
# node under test: its daemons' packages are installed once into an image of their own, keyed by the
# node image and the playbook's package list, and the playbook then only configures and starts them.
CEPH_REPO = "corectl-ceph"
CEPH_PLAYBOOK = Path("tests") / "ceph" / "server.yml"
CEPH_INSTALL_TASK = "Install the Ceph daemons"


def ceph_packages(root: Path) -> list[str]:
    """The packages tests/ceph/server.yml installs (its install task's list: one source)."""
    import yaml

    playbook = root / CEPH_PLAYBOOK
    for play in yaml.safe_load(playbook.read_text()):
        for task in play.get("tasks", []):
            if task.get("name") == CEPH_INSTALL_TASK:
                return list(task["ansible.builtin.apt"]["name"])
    raise CorectlError(f"{playbook}: no task named {CEPH_INSTALL_TASK!r}")


def ceph_image_tag(root: Path, release: str = DEFAULT_RELEASE) -> str:
    return _derived_tag(CEPH_REPO, release, {"packages": ceph_packages(root)})


def ensure_ceph_image(root: Path, release: str = DEFAULT_RELEASE) -> str:
    """The Ceph fixture's image tag, built from the release's node image when this machine lacks it."""
    install = (
        "set -e; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        f"{' '.join(ceph_packages(root))} >/dev/null; apt-get clean"
    )
    return _ensure_derived(root, release, ceph_image_tag(root, release), install, "corectl-ceph-build")


def _derived_tag(repo: str, release: str, recipe: dict) -> str:
    """An image made on a release's node image: its tag, keyed by the node image's tag and ``recipe``."""
    keyed = {"node": image_tag(release), **recipe}
    return f"{repo}:{hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]}"


def _ensure_derived(root: Path, release: str, tag: str, script: str, builder: str) -> str:
    """``tag``, built by running ``script`` on the release's node image when this machine lacks it; two
    processes asking at once (two lanes, two labs) build it once."""
    node = ensure_image(quiet=True, release=release)
    if image_exists(tag):
        return tag
    lock = root / "build" / f".{tag.split(':', 1)[0]}-{release}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not image_exists(tag):
            _commit_image(node, tag, script, builder)
    return tag


def _commit_image(base: str, tag: str, script: str, builder: str) -> None:
    """Run ``script`` in a container of ``base`` and commit the result as ``tag`` (booting /sbin/init)."""
    builder = f"{builder}-{os.getpid()}"
    docker("rm", "--force", builder, check=False)
    try:
        docker("run", "--name", builder, *accounting_flags(), base, "sh", "-c", script)
        docker("commit", "--change", 'CMD ["/sbin/init"]', builder, tag)
    finally:
        docker("rm", "--force", builder, check=False)


# The baked image (tests/standin/node-packages.yml): a release's node image with every Debian package the
# roles install, for molecule's nodes and the nodes a test adds after its lab's first provision (whose
# install the first provision proved on the bare image). Packages only: the services they enabled are
# disabled, the keys their maintainer scripts made removed; munge and slurm get the roles' fixed IDs first.
# Disabled means every link the installs made under /etc/systemd/system goes, aliases included: with only
# the .wants links gone, chrony (alias chronyd.service) and rsyslog (syslog.service) still said "enabled",
# so the roles' `enabled: true` had nothing to do and a node from this image came back from a reboot
# without them (session 33: the replaced head's no-op found them stopped on a restarted dgx02).
BAKED_REPO = "corectl-baked"
BAKED_LIST = Path("tests") / "standin" / "node-packages.yml"
BAKED_USERS = ("munge", "slurm")

BAKE_SCRIPT = r"""
set -eu
for spec in IDS; do
  name=${spec%%:*}; ids=${spec#*:}; uid=${ids%%:*}; gid=${ids#*:}
  getent group "$name" >/dev/null || groupadd --system --gid "$gid" "$name"
  getent passwd "$name" >/dev/null || useradd --system --uid "$uid" --gid "$name" --home-dir /nonexistent \
    --no-create-home --shell /usr/sbin/nologin "$name"
done
links() { find /etc/systemd/system -type l | sort; }
enabled() { systemctl --root=/ list-unit-files --state=enabled --no-legend | awk '{print $1}' | sort; }
links > /tmp/corectl-units-before
enabled > /tmp/corectl-enabled-before
apt-get update -qq
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq WITH >/dev/null
apt-get install -y -qq --no-install-recommends WITHOUT >/dev/null
links | comm -13 /tmp/corectl-units-before - | xargs -r rm -f
left=$(enabled | comm -13 /tmp/corectl-enabled-before -)
[ -z "$left" ] || { echo "bake: still enabled after the install: $left" >&2; exit 1; }
rm -f /tmp/corectl-units-before /tmp/corectl-enabled-before /etc/munge/munge.key \
  /etc/ssl/private/ssl-cert-snakeoil.key /etc/ssl/certs/ssl-cert-snakeoil.pem
apt-get clean
"""


def baked_packages(root: Path) -> tuple[list[str], list[str]]:
    """The baked packages (tests/standin/node-packages.yml): those with apt's recommends, those without."""
    import yaml

    path = root / BAKED_LIST
    try:
        data = yaml.safe_load(path.read_text())
        return sorted(data["packages"]), sorted(data["packages_without_recommends"])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise CorectlError(f"{path}: cannot read the baked package lists ({exc})") from None


def baked_ids(root: Path) -> dict[str, tuple[int, int]]:
    """munge's and slurm's fixed UID and GID, from their roles' defaults (one source)."""
    import yaml

    ids = {}
    for name in BAKED_USERS:
        defaults = yaml.safe_load((root / "roles" / name / "defaults" / "main.yml").read_text())
        ids[name] = (int(defaults[f"{name}_uid"]), int(defaults[f"{name}_gid"]))
    return ids


def bake_script(root: Path) -> str:
    with_recommends, without = baked_packages(root)
    ids = " ".join(f"{name}:{uid}:{gid}" for name, (uid, gid) in baked_ids(root).items())
    script = BAKE_SCRIPT.replace("IDS", ids).replace("WITHOUT", " ".join(without))
    return script.replace("WITH", " ".join(with_recommends))


def baked_image_tag(root: Path, release: str = DEFAULT_RELEASE) -> str:
    return _derived_tag(BAKED_REPO, release, {"script": bake_script(root)})


def ensure_baked_image(root: Path, release: str = DEFAULT_RELEASE) -> str:
    """The release's baked image tag, built from its node image when this machine lacks it."""
    return _ensure_derived(root, release, baked_image_tag(root, release), bake_script(root), "corectl-bake")
