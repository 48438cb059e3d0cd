"""NVLink checks: every link of every GPU active, error counters under the limit."""

from __future__ import annotations

import re

from .core import CheckFailed, Node, Skip, needs_gpus, summarize

NVLINK_HEADER = re.compile(r"^GPU (\d+):")
NVLINK_STATUS = re.compile(r"^\s*Link (\d+): (.+)$")
# Any "Link N: <counter>: <value>" line of `nvidia-smi nvlink -e`, also "Link 0: FEC Errors - 0: 17941761".
NVLINK_COUNTER = re.compile(r"^\s*Link (\d+): ([^:]*[^:\s])\s*:\s*(\S+)\s*$")
# The counters compared with nvlink_error_max: the names nvidia-smi prints for H100 (and the stand-in prints), see
# tests/samples/nvidia-smi-nvlink-e.h100-80gb-hbm3.txt. Newer drivers print other counters ("Rx Errors", "Tx
# discards", "FEC Errors - 0", "Effective BER", ...) whose meaning and scale differ (a healthy link counts billions
# of corrected codewords): they are named in a warning of the nvlink check, never compared or failed on.
NVLINK_ERROR_COUNTERS = ("Replay Errors", "Recovery Errors", "CRC Errors")


def nvlink_status(text: str) -> dict[int, dict[int, str]]:
    """GPU index -> link number -> status text ("26.562 GB/s" or "<inactive>")."""
    gpus: dict[int, dict[int, str]] = {}
    current: int | None = None
    for line in text.splitlines():
        header = NVLINK_HEADER.match(line)
        if header:
            current = int(header.group(1))
            gpus[current] = {}
            continue
        link = NVLINK_STATUS.match(line)
        if link and current is not None:
            gpus[current][int(link.group(1))] = link.group(2).strip()
    return gpus


def nvlink_counters(text: str) -> list[tuple[int, int, str, str]]:
    """(GPU, link, counter name, value as printed) from `nvidia-smi nvlink -e`, whatever the counter."""
    found = []
    current: int | None = None
    for line in text.splitlines():
        header = NVLINK_HEADER.match(line)
        if header:
            current = int(header.group(1))
            continue
        counter = NVLINK_COUNTER.match(line)
        if counter and current is not None:
            found.append((current, int(counter.group(1)), counter.group(2).strip(), counter.group(3)))
    return found


def nvlink_error_check(text: str, limit: int) -> tuple[list[str], list[str]]:
    """(known counters above limit, counters this check cannot judge) of `nvidia-smi nvlink -e` output.

    Only NVLINK_ERROR_COUNTERS with a number are judged; every other counter name (once) and a known counter
    without a number are returned as not checked, for a warning: a renamed counter must not be skipped unsaid.
    """
    over: list[str] = []
    unchecked: dict[str, None] = {}
    counters = nvlink_counters(text)
    for gpu, link, name, value in counters:
        if name not in NVLINK_ERROR_COUNTERS:
            unchecked[name] = None
        elif not value.isdigit():
            unchecked[f"{name} {value}"] = None
        elif int(value) > limit:
            over.append(f"GPU {gpu} link {link} {name} {value}")
    if not counters and text.strip():
        unchecked["no Link N: <counter>: <value> line"] = None
    return over, list(unchecked)


def check_nvlink(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    want = config["nvlink_links"]
    if want <= 0:
        raise Skip("no NVLink links expected (nvlink_links 0)")
    gpus = nvlink_status(node.smi("nvlink", "-s"))
    if not gpus:
        raise CheckFailed("nvidia-smi nvlink -s lists no GPUs")
    problems = []
    for index, links in sorted(gpus.items()):
        down = [str(n) for n, status in sorted(links.items()) if "inactive" in status.lower() or "GB/s" not in status]
        if down:
            problems.append(f"GPU {index} link{'s' if len(down) > 1 else ''} {','.join(down)} inactive")
        elif len(links) != want:
            problems.append(f"GPU {index} has {len(links)} of {want} links")
    if problems:
        raise CheckFailed(summarize(problems))
    limit = config["nvlink_error_max"]
    errors = node.run("nvidia-smi", "nvlink", "-e")
    note = ""
    if errors.rc == 0:
        over, unchecked = nvlink_error_check(errors.stdout, limit)
        if over:
            raise CheckFailed(f"NVLink error counters above {limit}: {summarize(over)}")
        if unchecked:
            note = f" (warning: NVLink counters this check does not know, not checked: {summarize(unchecked)})"
    else:
        note = " (error counters unavailable)"
    return f"{len(gpus)} GPUs x {want} links active{note}"
