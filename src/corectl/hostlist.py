"""Slurm-style host lists: ``dgx[01-12]``, ``dgx[01-03,07],head01`` and IPv4 address ranges.

Expansion is bounded: a list never yields more than ``limit`` names (``MAX_NODES`` by default),
and the count is known before any name is built, so ``dgx[1-99999999]`` fails at once.
"""

from __future__ import annotations

import ipaddress
import re

MAX_NODES = 100_000  # nodes per cluster corectl accepts (and names one host list may expand to)

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[^\[\]]+)\](?P<suffix>[^\[\]]*)$")


class HostlistError(ValueError):
    """A malformed host list or range."""


class TooManyNames(HostlistError):
    """A host list that expands to more names than allowed."""


def _short(expr: str) -> str:
    return expr if len(expr) <= 60 else expr[:57] + "..."


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


def _too_many(expr: str, limit: int) -> TooManyNames:
    return TooManyNames(
        f"'{_short(expr)}' expands to more than {limit:,} names (corectl supports at most {MAX_NODES:,} nodes)"
    )


def _expand_body(body: str, expr: str, room: int, limit: int) -> list[str]:
    """The values of one ``[..]`` body; at most ``room`` of them (else TooManyNames for ``limit``)."""
    values: list[str] = []
    for raw in body.split(","):
        item = raw.strip()
        if re.fullmatch(r"\d{1,18}", item):
            values.append(item)
        else:
            match = re.fullmatch(r"(\d{1,18})-(\d{1,18})", item)
            if not match:
                raise HostlistError(f"bad range '{_short(item)}' in '{_short(expr)}' (expected N or N-M)")
            low, high = match.group(1), match.group(2)
            if int(low) > int(high):
                raise HostlistError(f"range '{item}' in '{_short(expr)}' runs backwards")
            if len(values) + int(high) - int(low) + 1 > room:
                raise _too_many(expr, limit)
            width = len(low) if low.startswith("0") or len(low) == len(high) else 0
            values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
        if len(values) > room:
            raise _too_many(expr, limit)
    return values


def expand(expr: str, limit: int = MAX_NODES) -> list[str]:
    """Expand a host list into names, keeping the written order (at most ``limit`` names)."""
    names: list[str] = []
    for part in _split_top(expr):
        match = _BRACKET.match(part)
        if match is None:
            if "[" in part or "]" in part:
                raise HostlistError(f"only one [..] range per name is supported: '{_short(part)}'")
            if len(names) + 1 > limit:
                raise _too_many(expr, limit)
            names.append(part)
            continue
        for value in _expand_body(match.group("body"), expr, limit - len(names), limit):
            names.append(f"{match.group('prefix')}{value}{match.group('suffix')}")
    if not names:
        raise HostlistError("empty host list")
    return names


def expand_addresses(expr: str, count: int) -> list[str]:
    """Addresses for ``count`` nodes: a start address (incremented) or a ``10.0.1.[11-22]`` range."""
    if "[" in expr:
        try:
            addresses = expand(expr, limit=count)
        except TooManyNames:
            raise HostlistError(
                f"address range '{_short(expr)}' gives more than {count} addresses for {count} nodes"
            ) from None
    else:
        try:
            start = ipaddress.IPv4Address(expr)
        except ipaddress.AddressValueError as exc:
            raise HostlistError(f"'{_short(expr)}' is not an IPv4 address") from exc
        if int(start) + count - 1 > int(ipaddress.IPv4Address("255.255.255.255")):
            raise HostlistError(f"{count:,} addresses from {start} run past 255.255.255.255")
        addresses = [str(start + i) for i in range(count)]
    for address in addresses:
        try:
            ipaddress.IPv4Address(address)
        except ipaddress.AddressValueError as exc:
            raise HostlistError(f"'{_short(address)}' is not an IPv4 address") from exc
    if len(addresses) != count:
        raise HostlistError(f"address range '{_short(expr)}' gives {len(addresses)} addresses for {count} nodes")
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
