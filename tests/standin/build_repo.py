#!/usr/bin/env python3
"""Build the stand-in NVIDIA/enroot/pyxis artefacts and a signed flat apt repository for the test lab.

    python3 tests/standin/build_repo.py OUTDIR --image IMAGE

Idempotent: when OUTDIR/.recipe-hash matches the hash of every file under tests/standin, nothing is done.
Prints OUTDIR. Everything below OUTDIR is addressed by relative paths, so OUTDIR can be served as is
(python3 -m http.server). Needs dpkg-deb, gpg and Docker (enroot is built from its upstream source
in a container of IMAGE; see upstream/enroot-deb.sh).

Layout of OUTDIR:
  apt/                      flat repo: *.deb, Packages, Packages.gz, Release, InRelease, Release.gpg
  apt-updates/, apt-kernel/ flat repos of operating-system updates (corectl upgrade os's tests)
  apt-slurm/                flat repo: Debian's Slurm packages repacked as the next point release
                            (upstream/slurm-point-release.py; corectl upgrade slurm's tests)
  keys/corectl-standin.asc  ASCII-armoured public signing key
  enroot/v4.1.2/            enroot_4.1.2-1_amd64.deb, enroot+caps_4.1.2-1_amd64.deb, built from the
                            upstream source (not in the apt index, like GitHub's release assets)
  dcgm-exporter/4.2.3-4.1.3/dcgm-exporter_4.2.3-4.1.3_linux_amd64.tar.gz (+ .sha256)
  pyxis/archive/refs/tags/v0.24.0.tar.gz (+ .sha256): the pristine upstream release archive
  index.json                what was built
  ../.<OUTDIR>.gnupg/       signing key beside OUTDIR, not served (generated once, kept)
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAINTAINER = "corectl stand-ins <standin@corectl.invalid>"
KEY_UID = "corectl stand-in repository <standin@corectl.invalid>"
KEY_FILE = "keys/corectl-standin.asc"

DRIVER_VERSIONS = ("550.163.01", "580.82.07", "580.95.05", "580.105.08")
# Fabric Manager / NSCQ package suffix per driver version; 580.82.07 deliberately has none.
FM_SUFFIX = {"550.163.01": "-550", "580.95.05": "", "580.105.08": ""}
DCGM_VERSIONS = ("4.2.3", "4.1.1")
EXPORTER_VERSION = "4.2.3-4.1.3"
CONTAINER_CLI_VERSION = "1.17.8"
GRAFANA_VERSION = "11.6.0"
# enroot and pyxis are the real thing, built from pristine upstream release sources (the archives
# GitHub serves for the tags; see upstream_dir()), verified by these sha256.
ENROOT_VERSION = "4.1.2"
PYXIS_VERSION = "0.24.0"
UPSTREAM = {
    "enroot": (f"enroot-{ENROOT_VERSION}.tar.gz", "817e8d551135e6f3fc311d1ee57b03fb4d30325acba732f8dea43069ca11f8d3"),
    "pyxis": (f"pyxis-{PYXIS_VERSION}.tar.gz", "063653ba39125ac29796cc6079701d1ec34dd4c5baf698efacc0f36bf3619681"),
}
UPSTREAM_CACHE = HERE.parents[1] / "build" / "upstream"
OUTPUTS = (
    "apt", "apt-updates", "apt-kernel", "apt-slurm", "keys", "enroot", "dcgm-exporter", "pyxis", "index.json",
    ".recipe-hash",
)  # fmt: skip


@dataclass
class Package:
    name: str
    version: str
    summary: str
    arch: str = "amd64"
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    dirs: list[str] = field(default_factory=list)
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    postinst: str = ""
    prerm: str = ""
    postrm: str = ""
    in_apt: bool = True

    def add(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        self.files[path] = (content.encode() if isinstance(content, str) else content, mode)

    def add_source(self, path: str, source: str, mode: int = 0o644) -> None:
        self.add(path, (HERE / source).read_bytes(), mode)

    @property
    def deb_name(self) -> str:
        return f"{self.name}_{self.version.split(':', 1)[-1]}_{self.arch}.deb"

    def control(self) -> str:
        size_kib = max(1, sum(-(-len(content) // 1024) for content, _mode in self.files.values()))
        fields = [
            ("Package", self.name),
            ("Version", self.version),
            ("Architecture", self.arch),
            ("Maintainer", MAINTAINER),
            ("Installed-Size", str(size_kib)),
            ("Depends", ", ".join(self.depends)),
            ("Conflicts", ", ".join(self.conflicts)),
            ("Replaces", ", ".join(self.conflicts)),
            ("Section", "misc"),
            ("Priority", "optional"),
            ("Homepage", "https://corectl.invalid/standin"),
        ]
        text = "".join(f"{key}: {value}\n" for key, value in fields if value)
        return (
            text + f"Description: {self.summary} (corectl test stand-in)\n"
            " Test stand-in built by corectl's test suite. It mimics the interface of the\n"
            " real package closely enough for provisioning and health checks (over simulated\n"
            " GPUs, gpu-sim, where it concerns GPUs). It is not the vendor's software.\n"
        )


# --------------------------------------------------------------------------- helpers


def recipe_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(HERE.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".so", ".o"):
            continue
        digest.update(str(path.relative_to(HERE)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*argv: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"build_repo: {' '.join(argv[:3])}... failed:\n{exc.stderr}") from None


def with_version(source: str, version: str) -> bytes:
    """A tool script whose VERSION = "..." line carries the package version."""
    text = (HERE / source).read_text()
    text, count = re.subn(r'^VERSION = ".*"$', f'VERSION = "{version}"', text, count=1, flags=re.MULTILINE)
    if count != 1:
        raise SystemExit(f"{source}: no VERSION line")
    return text.encode()


SYSTEMD_RELOAD = "if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi\n"


def system_user(name: str) -> str:
    return (
        f"if ! getent passwd {name} >/dev/null; then\n"
        f"    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin {name}\n"
        "fi\n"
    )


def stop_on_remove(unit: str) -> str:
    return (
        '#!/bin/sh\nset -e\nif [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n'
        f"    systemctl stop {unit} >/dev/null 2>&1 || true\nfi\n"
    )


def postinst(body: str) -> str:
    return f'#!/bin/sh\nset -e\nif [ "$1" = configure ]; then\n{body}fi\n'


# --------------------------------------------------------------------------- the packages


def gpu_sim_package() -> Package:
    pkg = Package("gpu-sim", "1.0-1", "simulated NVIDIA GPUs for test nodes", arch="all", depends=["python3"])
    pkg.add_source("/usr/lib/gpu-sim/gpusim.py", "gpusim/gpusim.py")
    pkg.add_source("/usr/bin/gpu-sim", "gpusim/gpu_sim.py", 0o755)
    # nvme-cli's smart-log for the simulated drives (a shell script: the health check reads each drive each run)
    pkg.add_source("/usr/bin/gpu-sim-nvme", "gpusim/gpu-sim-nvme", 0o755)
    # nccl-tests' all_reduce_perf (built from GitHub on real nodes), answering for the simulated GPUs
    pkg.add_source("/usr/bin/gpu-sim-all-reduce-perf", "nccltests/all_reduce_perf.py", 0o755)
    # perftest's ib_write_bw (Debian's perftest needs an RDMA device), answering for the simulated ports
    pkg.add_source("/usr/bin/gpu-sim-ib-write-bw", "perftest/ib_write_bw.py", 0o755)
    pkg.add_source("/lib/systemd/system/gpu-sim-boot.service", "gpusim/gpu-sim-boot.service")
    pkg.postinst = postinst(
        SYSTEMD_RELOAD + "systemctl enable gpu-sim-boot.service >/dev/null 2>&1 || true\n"
        # First installation only: behave like the boot that would follow it.
        # With no description yet, describe a DGX H100 (8 GPUs, NVSwitch); tests re-init or inject faults.
        'if [ -z "$2" ]; then [ -e /etc/gpu-sim/gpus.json ] || gpu-sim init; gpu-sim boot || true; fi\n'
    )
    pkg.prerm = "#!/bin/sh\nset -e\nrm -rf /usr/lib/gpu-sim/__pycache__\n"
    return pkg


def driver_package(version: str) -> Package:
    branch = version.split(".", 1)[0]
    others = sorted({f"cuda-drivers-{v.split('.', 1)[0]}" for v in DRIVER_VERSIONS} - {f"cuda-drivers-{branch}"})
    pkg = Package(
        f"cuda-drivers-{branch}",
        f"{version}-1",
        f"NVIDIA driver {version}: nvidia-smi, nvidia-persistenced and nvidia-bug-report.sh",
        depends=["gpu-sim"],
        conflicts=others,
    )
    pkg.add_source("/usr/bin/nvidia-smi", "driver/nvidia_smi.py", 0o755)
    pkg.add_source("/usr/bin/nvidia-persistenced", "driver/nvidia_persistenced.py", 0o755)
    pkg.add_source("/usr/bin/nvidia-bug-report.sh", "driver/nvidia_bug_report.py", 0o755)
    pkg.add("/usr/lib/gpu-sim/driver-version", version + "\n")
    pkg.add_source("/lib/systemd/system/nvidia-persistenced.service", "driver/nvidia-persistenced.service")
    pkg.add("/etc/kernel/postinst.d/dkms", DKMS_HOOK, 0o755)
    # The running (loaded) driver only changes on reload/reboot, except on a first install.
    pkg.postinst = postinst(system_user("nvidia-persistenced") + SYSTEMD_RELOAD + "gpu-sim driver-installed || true\n")
    pkg.prerm = stop_on_remove("nvidia-persistenced.service")
    return pkg


def fabricmanager_packages(version: str) -> list[Package]:
    suffix = FM_SUFFIX[version]
    other = "" if suffix else "-550"
    fm = Package(
        f"nvidia-fabricmanager{suffix}",
        f"{version}-1",
        f"NVIDIA Fabric Manager {version}",
        depends=["gpu-sim"],
        conflicts=[f"nvidia-fabricmanager{other}"],
    )
    fm.add_source("/usr/bin/nv-fabricmanager", "fabricmanager/nv_fabricmanager.py", 0o755)
    fm.add("/usr/lib/gpu-sim/fm-version", version + "\n")
    fm.add_source("/usr/share/nvidia/nvswitch/fabricmanager.cfg", "fabricmanager/fabricmanager.cfg")
    fm.add_source("/lib/systemd/system/nvidia-fabricmanager.service", "fabricmanager/nvidia-fabricmanager.service")
    fm.postinst = postinst(SYSTEMD_RELOAD)
    fm.prerm = stop_on_remove("nvidia-fabricmanager.service")
    nscq = Package(
        f"libnvidia-nscq{suffix}",
        f"{version}-1",
        f"NVSwitch configuration and query library {version}",
        conflicts=[f"libnvidia-nscq{other}"],
    )
    nscq.add(f"/usr/lib/x86_64-linux-gnu/libnvidia-nscq.so.{version}", f"libnvidia-nscq stand-in {version}\n")
    return [fm, nscq]


def dcgm_packages(version: str) -> list[Package]:
    full = f"1:{version}-1"
    core = Package(
        "datacenter-gpu-manager-4-core", full, f"NVIDIA DCGM {version}: nv-hostengine and dcgmi", depends=["gpu-sim"]
    )
    core.add_source("/usr/bin/nv-hostengine", "dcgm/nv_hostengine.py", 0o755)
    core.add_source("/usr/bin/dcgmi", "dcgm/dcgmi.py", 0o755)
    core.add("/usr/lib/gpu-sim/dcgm-version", version + "\n")
    core.add_source("/lib/systemd/system/nvidia-dcgm.service", "dcgm/nvidia-dcgm.service")
    core.postinst = postinst(system_user("nvidia-dcgm") + SYSTEMD_RELOAD)
    core.prerm = stop_on_remove("nvidia-dcgm.service")
    cuda = Package(
        "datacenter-gpu-manager-4-cuda12",
        full,
        f"NVIDIA DCGM {version}: CUDA 12 diagnostics",
        depends=[f"datacenter-gpu-manager-4-core (= {full})"],
    )
    cuda.add("/usr/share/doc/datacenter-gpu-manager-4-cuda12/README.standin", f"DCGM {version} CUDA 12 stand-in\n")
    return [core, cuda]


def container_cli_package() -> Package:
    """NVIDIA's container CLI (libnvidia-container), which enroot's 98-nvidia.sh hook calls."""
    pkg = Package(
        "libnvidia-container-tools",
        f"{CONTAINER_CLI_VERSION}-1",
        "NVIDIA container runtime library (command-line tools)",
        depends=["python3"],
    )
    pkg.add_source("/usr/bin/nvidia-container-cli", "container-cli/nvidia_container_cli.py", 0o755)
    return pkg


def grafana_package() -> Package:
    """Grafana (from Grafana's own repository on real sites): the real package's paths, unit and
    defaults, with a stand-in server (grafana/grafana.py). Like the real package, installing it
    neither enables nor starts the service."""
    pkg = Package(
        "grafana", GRAFANA_VERSION, "Grafana (dashboards over data sources)", depends=["python3", "python3-yaml"]
    )
    pkg.add("/usr/share/grafana/bin/grafana", with_version("grafana/grafana.py", GRAFANA_VERSION), 0o755)
    pkg.add("/usr/sbin/grafana-server", '#!/bin/sh\nexec /usr/share/grafana/bin/grafana server "$@"\n', 0o755)
    pkg.add_source("/lib/systemd/system/grafana-server.service", "grafana/grafana-server.service")
    pkg.add_source("/etc/default/grafana-server", "grafana/grafana-server.default")
    pkg.add_source("/etc/grafana/grafana.ini", "grafana/grafana.ini")
    pkg.dirs += ["/etc/grafana/provisioning/dashboards", "/etc/grafana/provisioning/datasources"]
    pkg.postinst = postinst(
        "if ! getent group grafana >/dev/null; then groupadd --system grafana; fi\n"
        "if ! getent passwd grafana >/dev/null; then\n"
        "    useradd --system --gid grafana --home-dir /usr/share/grafana --shell /bin/false grafana\n"
        "fi\n"
        "install -d -o grafana -g grafana -m 0750 /var/lib/grafana /var/log/grafana\n"
        "chgrp -R grafana /etc/grafana && chmod 0750 /etc/grafana\n" + SYSTEMD_RELOAD
    )
    pkg.prerm = stop_on_remove("grafana-server.service")
    return pkg


def all_packages() -> list[Package]:
    packages = [gpu_sim_package(), container_cli_package(), grafana_package()]
    packages += [site_tools_package("1.0", asks_reboot=False), kernel_meta_package("1.0", None)]
    for version in DRIVER_VERSIONS:
        packages.append(driver_package(version))
        if version in FM_SUFFIX:
            packages += fabricmanager_packages(version)
    for version in DCGM_VERSIONS:
        packages += dcgm_packages(version)
    return packages


# ------------------------------------------------------- operating system updates (corectl upgrade os)
# The main repository has the 1.0 versions (the lab's base_extra_packages install them); apt-updates stands for
# a distribution's monthly updates (one package asks for a reboot, the kernel meta package pulls a new kernel the
# stand-in DKMS builds the NVIDIA modules for); apt-kernel for a kernel the driver's source does not build against.
# A test adds a repository to a node's apt sources when it wants the node offered its updates.
SITE_TOOLS = "corectl-standin-site-tools"
KERNEL_META = "linux-image-corectl-standin"
GOOD_KERNEL, BAD_KERNEL = "99.0.2-corectl-standin", "99.0.3-corectl-standin"
NO_NVIDIA_MARK = "corectl-standin-no-nvidia"
# DKMS's kernel hook, standing in: "builds" the NVIDIA modules for a kernel being installed
DKMS_HOOK = f"""#!/bin/sh
# corectl stand-in for DKMS's /etc/kernel/postinst.d/dkms: writes placeholder NVIDIA modules for a new kernel,
# except for a stand-in kernel marked {NO_NVIDIA_MARK} (one the driver's source does not build against).
set -e
kver="$1"
[ -n "$kver" ] && [ -d "/lib/modules/$kver" ] || exit 0
if [ -e "/lib/modules/$kver/{NO_NVIDIA_MARK}" ]; then
    echo "Error! Bad return status for module build on kernel: $kver (x86_64)" >&2
    exit 0
fi
mkdir -p "/lib/modules/$kver/updates/dkms"
for module in nvidia nvidia-uvm nvidia-modeset nvidia-drm; do
    echo "stand-in module for $kver" > "/lib/modules/$kver/updates/dkms/$module.ko"
done
"""


def site_tools_package(version: str, asks_reboot: bool) -> Package:
    pkg = Package(SITE_TOOLS, version, "a site's own tools, updated monthly", arch="all")
    pkg.add(f"/usr/share/{SITE_TOOLS}/VERSION", version + "\n")
    if asks_reboot:  # what Ubuntu's packages do through notify-reboot-required
        pkg.postinst = postinst(f"touch /run/reboot-required\necho {SITE_TOOLS} >> /run/reboot-required.pkgs\n")
    return pkg


def kernel_package(release: str, builds_nvidia: bool) -> Package:
    version = release.split("-", 1)[0] + "-1"
    pkg = Package(f"linux-image-{release}", version, f"Linux kernel {release} (containers run the host's kernel)")
    pkg.add(f"/boot/vmlinuz-{release}", "stand-in kernel image\n")
    pkg.add(f"/lib/modules/{release}/modules.order", "")
    if not builds_nvidia:
        pkg.add(f"/lib/modules/{release}/{NO_NVIDIA_MARK}", "the NVIDIA driver's source does not build here\n")
    # Debian's kernel packages run /etc/kernel/postinst.d; only the DKMS hook matters to a stand-in
    hook = f"[ ! -x /etc/kernel/postinst.d/dkms ] || /etc/kernel/postinst.d/dkms {release} /boot/vmlinuz-{release}\n"
    pkg.postinst = postinst(hook)
    pkg.postrm = (
        f'#!/bin/sh\nset -e\nif [ "$1" = remove ] || [ "$1" = purge ]; then rm -rf /lib/modules/{release}; fi\n'
    )
    return pkg


def kernel_meta_package(version: str, release: str | None) -> Package:
    depends = [f"linux-image-{release}"] if release else []
    return Package(KERNEL_META, version, "the latest stand-in kernel", arch="all", depends=depends)


def update_repositories() -> dict[str, list[Package]]:
    return {
        "apt-updates": [
            site_tools_package("1.1", asks_reboot=True),
            kernel_meta_package("2.0", GOOD_KERNEL),
            kernel_package(GOOD_KERNEL, builds_nvidia=True),
        ],
        "apt-kernel": [kernel_meta_package("3.0", BAD_KERNEL), kernel_package(BAD_KERNEL, builds_nvidia=False)],
    }


# --------------------------------------------------------------------------- upstream builds


def upstream_dir() -> Path:
    """Where the pristine upstream archives are: $CORECTL_UPSTREAM_SOURCES, else the workplace's
    shared/upstream beside the checkout (../shared/upstream), else /work/shared/upstream."""
    candidates = [Path(os.environ["CORECTL_UPSTREAM_SOURCES"])] if os.environ.get("CORECTL_UPSTREAM_SOURCES") else []
    candidates += [HERE.parents[2] / "shared" / "upstream", Path("/work/shared/upstream")]
    for candidate in candidates:
        if (candidate / UPSTREAM["enroot"][0]).is_file():
            return candidate
    raise SystemExit(
        f"build_repo: no upstream sources ({UPSTREAM['enroot'][0]}) in {', '.join(map(str, candidates))};"
        " set CORECTL_UPSTREAM_SOURCES"
    )


def upstream_archive(name: str) -> Path:
    filename, expected = UPSTREAM[name]
    path = upstream_dir() / filename
    if sha256_file(path) != expected:
        raise SystemExit(f"build_repo: {path}: sha256 is not the release's {expected}")
    return path


def built_once(cache: Path, ready: Callable[[Path], bool], image: str, volumes: list[str], argv: list[str]) -> None:
    """``argv`` run once in a throwaway container of ``image`` (``volumes`` mounted, its output folder at /out)
    unless ``cache`` is ``ready``: kept in build/upstream/, shared by every repository built here and locked
    against a concurrent build; a build cut off leaves only its .partial folder."""
    UPSTREAM_CACHE.mkdir(parents=True, exist_ok=True)
    with (UPSTREAM_CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready(cache):
            return
        partial = cache.with_name(cache.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        mounts = [f"--volume={volume}" for volume in [*volumes, f"{partial}:/out"]]
        run("docker", "run", "--rm", *mounts, image, *argv)
        shutil.rmtree(cache, ignore_errors=True)
        partial.rename(cache)


def enroot_debs(image: str) -> list[Path]:
    """enroot's release .debs built from the upstream archive in a container of ``image``: once per
    archive and recipe, kept in build/upstream/ (shared by every repository built here, locked
    against a concurrent build)."""
    archive = upstream_archive("enroot")
    script = HERE / "upstream" / "enroot-deb.sh"
    key = hashlib.sha256(archive.read_bytes() + script.read_bytes()).hexdigest()[:12]
    cache = UPSTREAM_CACHE / f"enroot-{ENROOT_VERSION}-{key}"
    names = [f"{name}_{ENROOT_VERSION}-1_amd64.deb" for name in ("enroot", "enroot+caps")]
    volumes = [f"{archive}:/src/{archive.name}:ro", f"{script}:/src/enroot-deb.sh:ro"]
    built_once(cache, lambda done: all((done / name).is_file() for name in names), image, volumes,
               ["bash", "/src/enroot-deb.sh", f"/src/{archive.name}", "/out"])  # fmt: skip
    return [cache / name for name in names]


SLURM_REPO = "apt-slurm"


def slurm_point_release_debs(image: str) -> list[Path]:
    """Debian's Slurm packages of ``image``'s release, repacked as the next point release in a container of
    ``image`` (upstream/slurm-point-release.py): once per script, kept in build/upstream/ like enroot's."""
    script = HERE / "upstream" / "slurm-point-release.py"
    cache = UPSTREAM_CACHE / f"slurm-point-release-{hashlib.sha256(script.read_bytes()).hexdigest()[:12]}"
    volumes = [f"{script}:/src/slurm-point-release.py:ro"]
    built_once(cache, lambda done: any(done.glob("slurmd_*.deb")), image, volumes,
               ["python3", "/src/slurm-point-release.py", "/out"])  # fmt: skip
    return sorted(cache.glob("*.deb"))


def prebuilt_stanza(deb: Path, relative: str) -> str:
    """The Packages stanza of a .deb built elsewhere: its own control fields, where it is, its checksums."""
    control = run("dpkg-deb", "--field", str(deb)).stdout
    head, description = control.split("Description:", 1)
    data = deb.read_bytes()
    where = (
        f"Filename: ./{relative}\nSize: {len(data)}\n"
        f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
        f"SHA1: {hashlib.sha1(data).hexdigest()}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
    )
    return f"{head}{where}Description:{description.rstrip()}\n"


# --------------------------------------------------------------------------- building


def build_deb(pkg: Package, outdir: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="standin-deb-") as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        for directory in pkg.dirs:
            (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for path, (content, mode) in pkg.files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode)
        for dirpath, _dirnames, _filenames in os.walk(root):
            Path(dirpath).chmod(0o755)
        (root / "DEBIAN" / "control").write_text(pkg.control())
        conffiles = sorted(p for p in pkg.files if p.startswith("/etc/"))
        if conffiles:
            (root / "DEBIAN" / "conffiles").write_text("".join(f"{p}\n" for p in conffiles))
        for script in ("postinst", "prerm", "postrm"):
            body = getattr(pkg, script)
            if body:
                (root / "DEBIAN" / script).write_text(body)
                (root / "DEBIAN" / script).chmod(0o755)
        outdir.mkdir(parents=True, exist_ok=True)
        deb = outdir / pkg.deb_name
        run("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb))
    return deb


def packages_index(pkg: Package, deb: Path) -> str:
    """The Packages stanza: the control fields plus where the .deb is and its checksums."""
    data = deb.read_bytes()
    head, description = pkg.control().split("Description:", 1)
    where = (
        f"Filename: ./{deb.name}\nSize: {len(data)}\n"
        f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
        f"SHA1: {hashlib.sha1(data).hexdigest()}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
    )
    return f"{head}{where}Description:{description}"


def release_file(apt: Path) -> str:
    names = ("Packages", "Packages.gz")
    lines = [
        "Origin: corectl-standin",
        "Label: corectl stand-in packages",
        "Architectures: amd64 all",
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}",
        "Description: Stand-in NVIDIA packages for corectl tests (not NVIDIA software)",
    ]
    for title, algo in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        lines.append(f"{title}:")
        for name in names:
            data = (apt / name).read_bytes()
            lines.append(f" {algo(data).hexdigest()} {len(data):>16} {name}")
    return "\n".join(lines) + "\n"


class Signer:
    """gpg with the repository key beside OUTDIR (never inside the served tree), used through a short
    symlink (socket path limits)."""

    def __init__(self, outdir: Path) -> None:
        self.home = outdir.parent / f".{outdir.name}.gnupg"
        self.home.mkdir(mode=0o700, exist_ok=True)
        self.home.chmod(0o700)
        self._tmp = Path(tempfile.mkdtemp(prefix="gsk", dir="/tmp"))
        self.link = self._tmp / "h"
        self.link.symlink_to(self.home)

    def gpg(self, *args: str) -> str:
        base = ("gpg", "--homedir", str(self.link), "--batch", "--yes", "--pinentry-mode", "loopback")
        return run(*base, "--passphrase", "", *args).stdout

    def fingerprint(self) -> str | None:
        listing = subprocess.run(
            ["gpg", "--homedir", str(self.link), "--batch", "--with-colons", "--list-secret-keys", KEY_UID],
            check=False,
            capture_output=True,
            text=True,
        )
        for line in listing.stdout.splitlines():
            if line.startswith("fpr:"):
                return line.split(":")[9]
        return None

    def ensure_key(self) -> str:
        fpr = self.fingerprint()
        if fpr is None:
            self.gpg("--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
            fpr = self.fingerprint()
        if fpr is None:
            raise SystemExit("gpg: key generation failed")
        return fpr

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.link), "--kill", "all"], check=False, capture_output=True)
        shutil.rmtree(self._tmp, ignore_errors=True)


def write_tarball(target: Path, top: str, members: list[tuple[str, bytes, int]]) -> str:
    """A .tar.gz with one top directory, root-owned members; writes TARGET.sha256; returns the sha256."""
    buffer = io.BytesIO()
    mtime = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(top)
        info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o755, mtime, "root", "root"
        tar.addfile(info)
        for name, content, mode in members:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime, info.uname, info.gname = len(content), mode, mtime, "root", "root"
            tar.addfile(info, io.BytesIO(content))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(buffer.getvalue(), mtime=0))
    digest = sha256_file(target)
    target.with_name(target.name + ".sha256").write_text(f"{digest}  {target.name}\n")
    return digest


def write_index(apt: Path, stanzas: list[str]) -> None:
    packages = "\n".join(stanzas)
    (apt / "Packages").write_text(packages)
    (apt / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
    (apt / "Release").write_text(release_file(apt))


def build(outdir: Path, image: str) -> dict:
    for name in OUTPUTS:
        path = outdir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    index: dict = {"recipe_hash": recipe_hash(), "packages": [], "archives": []}
    flat = {"apt": all_packages(), **update_repositories()}
    for folder, members in flat.items():
        apt = outdir / folder
        apt.mkdir(parents=True)
        stanzas = []
        for pkg in members:
            deb = build_deb(pkg, apt)
            if pkg.in_apt:
                stanzas.append(packages_index(pkg, deb))
            index["packages"].append(
                {
                    "name": pkg.name,
                    "version": pkg.version,
                    "architecture": pkg.arch,
                    "path": str(deb.relative_to(outdir)),
                    "sha256": sha256_file(deb),
                    "in_apt": pkg.in_apt,
                }
            )
        write_index(apt, stanzas)
    apt = outdir / SLURM_REPO  # prebuilt: Debian's own packages under a new version
    apt.mkdir(parents=True)
    stanzas = []
    for built in slurm_point_release_debs(image):
        deb = Path(shutil.copy2(built, apt / built.name))
        stanzas.append(prebuilt_stanza(deb, deb.name))
        name, version = deb.name.split("_")[:2]
        index["packages"].append(
            {"name": name, "version": version, "architecture": deb.stem.rsplit("_", 1)[-1],
             "path": str(deb.relative_to(outdir)), "sha256": sha256_file(deb), "in_apt": True}
        )  # fmt: skip
    write_index(apt, stanzas)
    releases = outdir / "enroot" / f"v{ENROOT_VERSION}"  # GitHub's release layout, not in the apt index
    releases.mkdir(parents=True)
    for built in enroot_debs(image):
        deb = Path(shutil.copy2(built, releases / built.name))
        name = deb.name.split("_")[0]
        index["packages"].append(
            {
                "name": name,
                "version": f"{ENROOT_VERSION}-1",
                "architecture": "amd64",
                "path": str(deb.relative_to(outdir)),
                "sha256": sha256_file(deb),
                "in_apt": False,
            }
        )
    signer = Signer(outdir)
    try:
        fpr = signer.ensure_key()
        sign = ("--local-user", fpr, "--digest-algo", "SHA512")
        for folder in [*flat, SLURM_REPO]:
            apt = outdir / folder
            release = str(apt / "Release")
            signer.gpg(*sign, "--clearsign", "-o", str(apt / "InRelease"), release)
            signer.gpg(*sign, "--detach-sign", "-o", str(apt / "Release.gpg"), release)
        (outdir / "keys").mkdir()
        (outdir / KEY_FILE).write_text(signer.gpg("--armor", "--export", fpr))
    finally:
        signer.close()
    index["apt"] = {
        "path": "apt",
        "key": KEY_FILE,
        "fingerprint": fpr,
        "sources_line": "deb [signed-by=/etc/apt/keyrings/corectl-standin.asc] http://HOST:PORT/apt ./",
        "updates": sorted(update_repositories()),  # more flat repositories beside it, same key and line
        "slurm": SLURM_REPO,  # the Slurm point release (a flat repository beside it, same key and line)
    }

    top = f"dcgm-exporter_{EXPORTER_VERSION}_linux_amd64"
    target = outdir / "dcgm-exporter" / EXPORTER_VERSION / f"{top}.tar.gz"
    members = [
        ("dcgm-exporter", with_version("dcgm-exporter/dcgm_exporter.py", EXPORTER_VERSION), 0o755),
        ("default-counters.csv", (HERE / "dcgm-exporter" / "default-counters.csv").read_bytes(), 0o644),
    ]
    digest = write_tarball(target, top, members)
    index["archives"].append(
        {
            "name": "dcgm-exporter",
            "version": EXPORTER_VERSION,
            "path": str(target.relative_to(outdir)),
            "sha256": digest,
        }
    )

    target = outdir / "pyxis" / "archive" / "refs" / "tags" / f"v{PYXIS_VERSION}.tar.gz"
    target.parent.mkdir(parents=True)
    shutil.copyfile(upstream_archive("pyxis"), target)  # the release archive as GitHub serves it
    digest = sha256_file(target)
    (target.parent / (target.name + ".sha256")).write_text(f"{digest}  {target.name}\n")
    index["archives"].append(
        {"name": "pyxis", "version": PYXIS_VERSION, "path": str(target.relative_to(outdir)), "sha256": digest}
    )

    index["drivers"] = {
        version: {
            "driver_package": f"cuda-drivers-{version.split('.')[0]}",
            "fabricmanager_package": f"nvidia-fabricmanager{FM_SUFFIX[version]}" if version in FM_SUFFIX else None,
            "nscq_package": f"libnvidia-nscq{FM_SUFFIX[version]}" if version in FM_SUFFIX else None,
            "package_version": f"{version}-1",
        }
        for version in DRIVER_VERSIONS
    }
    # Direct keys for callers (corectl.lab.repo): the archives by name, and the enroot release directory.
    for archive in index["archives"]:
        index[archive["name"].replace("-", "_")] = archive
    index["enroot"] = {"version": ENROOT_VERSION, "path": f"enroot/v{ENROOT_VERSION}"}
    (outdir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    (outdir / ".recipe-hash").write_text(index["recipe_hash"] + "\n")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the stand-in apt repository and release artefacts.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--image", required=True, help="the Debian 12 image enroot is built in (the node image)")
    args = parser.parse_args(argv)
    outdir = args.outdir.resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = outdir / ".recipe-hash"
    current = recipe_hash()
    # labs and molecule scenarios that start at once (tests/stages.py's lanes) build it once: the others wait here
    with (outdir.parent / f".{outdir.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.is_file() and stamp.read_text().strip() == current and (outdir / "index.json").is_file()):
            for tool in ("dpkg-deb", "gpg", "gpgconf"):
                if shutil.which(tool) is None:
                    print(f"build_repo: {tool} is required", file=sys.stderr)
                    return 1
            build(outdir, args.image)
    print(outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
