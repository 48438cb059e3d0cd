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
