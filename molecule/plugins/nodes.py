"""molecule's create and destroy for corectl's scenarios (molecule/plugins/create.yml, destroy.yml).

The stand-in nodes of a scenario, started and removed with the docker CLI from the platforms of its
molecule.yml (as molecule interpolated them): the same containers molecule-plugins' docker driver made
(its labels, the scenario's network and addresses, the flags each platform lists), without that
driver's playbooks, whose docker modules, asynchronous starts and polling cost about 15 CPU-seconds a
create and 7.5 a destroy on the 2-core machine (docs/testing.md, "molecule's own create and destroy").

    nodes.py create|destroy PLATFORMS_JSON

Prints one JSON object: {"changed": [what it created or removed]}. A platform key this script does not
know is an error, so a flag added to a molecule.yml is never dropped without a word.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

from corectl.errors import CorectlError
from corectl.lab.docker import docker  # the lab's docker CLI call: stdout, or a one-line CorectlError

OWNER = {"owner": "molecule"}  # the label molecule-plugins' driver puts on its containers and networks
KNOWN = {
    "name", "image", "pre_build_image", "command", "labels", "capabilities", "security_opts", "cgroupns_mode",
    "volumes", "tmpfs", "devices", "networks", "docker_networks", "groups",
}  # fmt: skip


class PlatformError(CorectlError):
    """A platform this script cannot start as molecule.yml says."""


def running(kind: str, name: str) -> str:
    """A container's or network's state: "" when there is none, else "true" or "false" (a network: "true")."""
    field = "{{.State.Running}}" if kind == "container" else "true"
    return docker(kind, "inspect", "--format", field, name, check=False).strip()


def labels(values: dict[str, str]) -> list[str]:
    return [arg for key, value in {**OWNER, **values}.items() for arg in ("--label", f"{key}={value}")]


def run_argv(platform: dict[str, Any]) -> list[str]:
    """`docker run` for one platform (docker_container's options of the same names)."""
    unknown = sorted(set(platform) - KNOWN)
    if unknown:
        raise PlatformError(f"platform {platform.get('name')}: molecule/plugins/nodes.py does not handle {unknown}")
    name = platform["name"]
    argv = ["run", "--detach", "--name", name, "--hostname", name, "--log-driver", "json-file"]
    argv += labels(platform.get("labels", {}))
    argv += [arg for cap in platform.get("capabilities", []) for arg in ("--cap-add", cap)]
    argv += [arg for opt in platform.get("security_opts", []) for arg in ("--security-opt", opt)]
    if "cgroupns_mode" in platform:
        argv += ["--cgroupns", platform["cgroupns_mode"]]
    argv += [arg for volume in platform.get("volumes", []) for arg in ("--volume", volume)]
    argv += [arg for mount in platform.get("tmpfs", []) for arg in ("--tmpfs", mount)]
    argv += [arg for device in platform.get("devices", []) for arg in ("--device", device)]
    networks = platform.get("networks", [])
    if len(networks) > 1:
        raise PlatformError(f"platform {name}: one network per node (docker run attaches one)")
    for network in networks:
        argv += ["--network", network["name"]]
        if "ipv4_address" in network:
            argv += ["--ip", network["ipv4_address"]]
    argv.append(platform["image"])
    argv += shlex.split(platform.get("command", ""))
    return argv


def scenario_networks(platforms: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {net["name"]: net for platform in platforms for net in platform.get("docker_networks", [])}


def create(platforms: list[dict[str, Any]]) -> list[str]:
    changed = []
    for name, network in scenario_networks(platforms).items():
        if not running("network", name):
            subnets = [arg for ipam in network.get("ipam_config", []) for arg in ("--subnet", ipam["subnet"])]
            docker("network", "create", *subnets, *labels(network.get("labels", {})), name)
            changed.append(f"network {name}")
    for platform in platforms:
        argv = run_argv(platform)  # every platform checked before the first container starts
        state = running("container", platform["name"])
        if state:
            if state != "true":
                docker("start", platform["name"])
                changed.append(f"started {platform['name']}")
            continue
        docker(*argv)
        changed.append(f"container {platform['name']}")
    return changed


def destroy(platforms: list[dict[str, Any]]) -> list[str]:
    changed = []
    for platform in platforms:
        if running("container", platform["name"]):
            docker("rm", "--force", "--volumes", platform["name"])
            changed.append(f"container {platform['name']}")
    for name in scenario_networks(platforms):
        if running("network", name):
            docker("network", "rm", name)
            changed.append(f"network {name}")
    return changed


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("create", "destroy"):
        print("usage: nodes.py create|destroy PLATFORMS_JSON", file=sys.stderr)
        return 2
    platforms = json.loads(argv[2])
    try:
        changed = create(platforms) if argv[1] == "create" else destroy(platforms)
    except CorectlError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"changed": changed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
