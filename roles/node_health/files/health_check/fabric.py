"""NVSwitch fabric checks: Fabric Manager's version and service, and every GPU's fabric state."""

from __future__ import annotations

import re

from .core import NOT_AVAILABLE, CheckFailed, Node, needs_nvswitch, summarize


def check_fm_version(node: Node) -> str:
    needs_nvswitch(node.config)
    loaded = node.driver()
    result = node.run("nv-fabricmanager", "--version")
    match = re.search(r"version is\s*:\s*(\S+)", result.stdout + result.stderr)
    if result.rc != 0 or not match:
        raise CheckFailed(f"nv-fabricmanager --version failed (rc {result.rc}): {result.first_line() or 'no output'}")
    fm = match.group(1)
    if fm != loaded:
        raise CheckFailed(f"Fabric Manager {fm} installed, driver {loaded} loaded")
    return f"Fabric Manager {fm} matches the driver"


def check_fabricmanager(node: Node) -> str:
    config = node.config
    needs_nvswitch(config)
    unit = config["fabricmanager_service"]
    state = node.service_state(unit)
    if state != "active":
        raise CheckFailed(f"{unit} is {state}")
    return f"{unit} is active"


def fabric_states(report: str) -> list[tuple[str, str, str]]:
    """(bus id, fabric state, fabric status) per GPU from `nvidia-smi -q`."""
    found: list[tuple[str, str, str]] = []
    bus, state, status = "", "", ""
    section = 0  # indent of the Fabric heading while inside its section, else 0
    child = 0  # indent of the section's own keys (deeper ones belong to sub-sections)
    for line in report.splitlines():
        header = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if header:
            if bus:
                found.append((bus, state, status))
            bus, state, status, section = header.group(1), "", "", 0
            continue
        stripped = line.strip()
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if section and indent <= section:
            section = 0
        if stripped == "Fabric" and bus:
            section, child = indent, 0
            continue
        if section:
            child = child or indent
            if indent != child:
                continue
            key, _, value = stripped.partition(":")
            if key.strip() == "State":
                state = value.strip()
            elif key.strip() == "Status":
                status = value.strip()
    if bus:
        found.append((bus, state, status))
    return found


def check_fabric(node: Node) -> str:
    needs_nvswitch(node.config)
    states = fabric_states(node.smi("-q"))
    if not states:
        raise CheckFailed("nvidia-smi -q lists no GPUs")
    bad = [
        f"GPU {i} ({bus}) {state or 'unknown'}" + (f"/{status}" if status and status not in NOT_AVAILABLE else "")
        for i, (bus, state, status) in enumerate(states)
        if state != "Completed" or status not in ("Success", *NOT_AVAILABLE)
    ]
    if bad:
        raise CheckFailed(f"fabric not completed: {summarize(bad)}")
    return f"fabric Completed on {len(states)} GPUs"
