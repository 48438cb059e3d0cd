"""DCGM diagnostics: dcgmi diag at the configured level, with its failures named."""

from __future__ import annotations

import json
from typing import Any

from .core import CheckFailed, Node, Skip, needs_gpus, summarize


def diag_failures(data: Any) -> list[str]:
    """Failure messages anywhere in `dcgmi diag -j` output (stand-in and DCGM 3/4 layouts)."""
    found: list[str] = []

    def text_of(item: Any) -> str:
        if isinstance(item, dict):
            return str(item.get("warning") or item.get("message") or item.get("error") or json.dumps(item))
        return str(item)

    def walk(item: Any, test: str) -> None:
        if isinstance(item, dict):
            name = str(item.get("name") or item.get("test_name") or test)
            verdict = str(item.get("status") or item.get("result") or "")
            gpu = next((item[k] for k in ("index", "gpu_id", "entity_id") if k in item), None)
            if verdict.lower() == "fail" and ("warnings" in item or "error" in item or gpu is not None):
                where = f"GPU {gpu}" if gpu is not None else name
                details = [text_of(w) for w in item.get("warnings") or []] or [text_of(item.get("error", ""))]
                found.append(f"{where}: {'; '.join(d for d in details if d) or 'Fail'}")
            for value in item.values():
                walk(value, name)
        elif isinstance(item, list):
            for value in item:
                walk(value, test)

    walk(data, "diag")
    return found


def check_dcgm_diag(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    level = config["dcgm_diag_level"]
    if level <= 0:
        raise Skip("dcgmi diag off (level 0)")
    result = node.run("dcgmi", "diag", "-r", str(level), "-j", timeout=float(config["dcgm_diag_timeout_s"]))
    if result.rc == 0:
        return f"dcgmi diag -r {level} passed"
    try:
        data = json.loads(result.stdout)
    except ValueError:
        raise CheckFailed(
            f"dcgmi diag -r {level} failed (rc {result.rc}): {result.first_line() or 'no output'}"
        ) from None
    failures = diag_failures(data)
    raise CheckFailed(f"dcgmi diag -r {level} failed: {summarize(failures, 2) if failures else 'rc ' + str(result.rc)}")


# `dcgmi health -c` (tests/samples/dcgmi-health-c.*.txt): a tree of two columns, each row "| <left> | <right> |";
# the left column names "Overall Health", an entity group ("GPU"), an entity ("-> 0"), "-> Errors" and a system
# ("-> PCIe system"), each deeper by three spaces; the right one its health (Healthy, Warning, Failure) and, on rows
# with an empty left cell, the incident's message wrapped over several rows.
NOT_WATCHED = "Health watches not enabled"
HEALTH_SEVERITIES = ("Healthy", "Warning", "Failure")


def health_incidents(text: str) -> tuple[str, list[tuple[str, str, str, str]]]:
    """(overall health, [(entity, system, severity, message)]) from `dcgmi health -c`'s table."""
    overall = ""
    incidents: list[list[str]] = []
    group = entity = ""
    for line in text.splitlines():
        cells = line.strip().strip("|").split("|")
        if not line.startswith("|") or len(cells) != 2:
            continue
        left, right = cells[0].strip(), cells[1].strip()
        label = left.removeprefix("-> ")
        depth = (len(cells[0]) - len(cells[0].lstrip()) - 1) // 3
        if left == "Overall Health":
            overall = right
        elif not left:
            if incidents and right:
                incidents[-1][3] = f"{incidents[-1][3]} {right}".strip()
        elif not left.startswith("-> "):
            group = label
        elif depth == 0:
            entity = f"{group} {label}".strip()
        elif label != "Errors" and right in HEALTH_SEVERITIES:
            incidents.append([entity, label, right, ""])
    return overall, [(e, s, h, m) for e, s, h, m in incidents]


def check_dcgm_health(node: Node) -> str:
    """DCGM's background health watches (PCIe, memory, InfoROM, thermal, power, NVLink, driver): a Failure fails the
    node, a Warning is said; watches not set (a host engine that restarted) are set again."""
    config = node.config
    needs_gpus(config)
    if not config["dcgm_health"]:
        raise Skip("DCGM health watches off")
    result = node.run("dcgmi", "health", "-c")
    if NOT_WATCHED in result.stdout + result.stderr:
        again = node.run("dcgmi", "health", "-s", "a")
        if again.rc != 0:
            raise CheckFailed(f"DCGM health watches not set, and dcgmi health -s a failed: {again.first_line()}")
        return "warning: DCGM health watches were not set (the host engine restarted?): set now, read from the next run"
    overall, incidents = health_incidents(result.stdout)
    if result.rc != 0 or overall not in HEALTH_SEVERITIES:
        raise CheckFailed(f"dcgmi health -c failed (rc {result.rc}): {result.first_line() or 'no output'}")
    said = [f"{entity} {system}: {severity}: {message}" for entity, system, severity, message in incidents]
    if overall == "Failure":
        failed = [s for s, (_e, _sy, severity, _m) in zip(said, incidents, strict=True) if severity == "Failure"]
        raise CheckFailed(f"DCGM health: {summarize(failed or said, 2)}")
    if overall == "Warning":
        return f"warning: DCGM health: {summarize(said, 2)}"
    return "DCGM health watches: healthy"
