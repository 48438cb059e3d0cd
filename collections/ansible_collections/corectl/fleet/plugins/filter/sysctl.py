"""Kernel settings as roles base and enroot keep them: one sysctl.d file, one read of the live values, and
one rule for whether they differ (sysctl prints a value's fields tab-separated, a role writes them with
spaces: both are compared with their whitespace runs as one space)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_SPACE = re.compile(r"\s+")


def _normal(value: object) -> str:
    return _SPACE.sub(" ", str(value).strip())


def sysctl_conf(settings: Mapping[str, Any], header: str) -> str:
    """The sysctl.d file: the header line, then ``name=value`` per setting in name order."""
    return "".join([f"{header}\n", *(f"{name}={value}\n" for name, value in sorted(settings.items()))])


def sysctl_differs(running: Sequence[str], settings: Mapping[str, Any]) -> bool:
    """Whether ``sysctl -n NAME...`` (the settings' names in name order) printed other values than wanted."""
    wanted = [_normal(value) for _, value in sorted(settings.items())]
    return [_normal(line) for line in running] != wanted


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sysctl_conf": sysctl_conf, "sysctl_differs": sysctl_differs}
