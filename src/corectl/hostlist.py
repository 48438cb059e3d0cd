"""Slurm-style host lists: ``dgx[01-12]``, ``dgx[01-03,07],head01`` and IPv4 address ranges."""

from __future__ import annotations

import ipaddress
import re

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[^\[\]]+)\](?P<suffix>[^\[\]]*)$")


class HostlistError(ValueError):
    """A malformed host list or range."""


def _split_top(expr: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in expr:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in '{expr}'")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in '{expr}'")
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_body(body: str, expr: str) -> list[str]:
    values: list[str] = []
    for raw in body.split(","):
        item = raw.strip()
        if re.fullmatch(r"\d+", item):
            values.append(item)
            continue
        match = re.fullmatch(r"(\d+)-(\d+)", item)
        if not match:
            raise HostlistError(f"bad range '{item}' in '{expr}' (expected N or N-M)")
        low, high = match.group(1), match.group(2)
        if int(low) > int(high):
            raise HostlistError(f"range '{item}' in '{expr}' runs backwards")
        width = len(low) if low.startswith("0") or len(low) == len(high) else 0
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand(expr: str) -> list[str]:
    """Expand a host list into names, keeping the written order."""
    names: list[str] = []
    for part in _split_top(expr):
        match = _BRACKET.match(part)
        if match is None:
            if "[" in part or "]" in part:
                raise HostlistError(f"only one [..] range per name is supported: '{part}'")
            names.append(part)
            continue
        for value in _expand_body(match.group("body"), expr):
            names.append(f"{match.group('prefix')}{value}{match.group('suffix')}")
    if not names:
        raise HostlistError("empty host list")
    return names


def expand_addresses(expr: str, count: int) -> list[str]:
    """Addresses for ``count`` nodes: a start address (incremented) or a ``10.0.1.[11-22]`` range."""
    if "[" in expr:
        addresses = expand(expr)
    else:
        try:
            start = ipaddress.IPv4Address(expr)
        except ipaddress.AddressValueError as exc:
            raise HostlistError(f"'{expr}' is not an IPv4 address") from exc
        addresses = [str(start + i) for i in range(count)]
    for address in addresses:
        try:
            ipaddress.IPv4Address(address)
        except ipaddress.AddressValueError as exc:
            raise HostlistError(f"'{address}' is not an IPv4 address") from exc
    if len(addresses) != count:
        raise HostlistError(f"address range '{expr}' gives {len(addresses)} addresses for {count} nodes")
    return addresses


def compress(names: list[str]) -> str:
    """The shortest common Slurm form for ``names`` (used in generated config, sorted)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if match is None:
            plain.append(name)
            continue
        groups.setdefault((match.group(1), len(match.group(2))), []).append(int(match.group(2)))
    out = list(plain)
    for (prefix, width), found in groups.items():
        numbers = sorted(set(found))
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        runs: list[str] = []
        begin = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(f"{begin:0{width}d}" if begin == prev else f"{begin:0{width}d}-{prev:0{width}d}")
            if n is not None:
                begin = prev = n
        out.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(sorted(out))
