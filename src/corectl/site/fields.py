"""Constrained field types of cluster.yml: names, addresses, ports, paths, SSH keys.

Each type narrows a field whose value becomes a name, an address or a token in a generated file
or a command line; ``model.py`` builds the sections from them.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

# Every string of cluster.yml also passes loader.py's generic rule (no Jinja markers, no control
# characters, at most 4096 characters). The types below narrow the fields whose values become a
# name, an address or a token in a generated file or a command line.

Identifier = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*$", max_length=63)]
HostExpr = Annotated[str, StringConstraints(pattern=r"^[a-z0-9\[\],-]+$", min_length=1, max_length=4096)]
# an absolute path of portable characters: no space, comma, colon or quote (paths land in fstab
# fields and mount options, /etc/passwd, slurm.conf)
AbsPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._/@+-]*$", max_length=4096)]
Port = Annotated[int, Field(ge=1, le=65535)]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=63)]
# rack and leaf labels: like Identifier, but digits first, capitals and dots are fine (``R1.2``)
Label = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=63)]
# a POSIX login name (portable filename characters, not starting with '-', at most 32)
PosixUser = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9._-]*$", max_length=32)]
# an IANA zone name (checked against the zone database in checks.py): no '..', no absolute path
TimeZone = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$", max_length=63)]
# a private key file: no whitespace, quotes, shell characters or ssh '%' tokens; not an option ('-o...')
KeyPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._/~+@][A-Za-z0-9._/~+@-]*$", max_length=4096)]
# one fstab mount option, ``name`` or ``name=value``: no space, no comma (which would add options)
MountOption = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9_][a-z0-9_.-]*(=[A-Za-z0-9_.:/@+-]+)?$", max_length=255)
]

_HOST_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_HOST_LABEL}(\.{_HOST_LABEL})*\.?$")


def _host_problem(value: str) -> str | None:
    """Why ``value`` is not a host name or an IPv4/IPv6 literal (None: it is one)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        pass
    else:
        return "scoped IPv6 addresses (with '%') are not supported" if "%" in value else None
    if len(value) > 253 or not _HOSTNAME.match(value):
        return "is not a host name or an IPv4/IPv6 address"
    if value.rstrip(".").rsplit(".", 1)[-1].isdigit():
        return "is not a valid IPv4 address"  # 10.0.0.300, 1.2.3: all-numeric names are not host names
    return None


def _host(value: str) -> str:
    problem = _host_problem(value)
    if problem is not None:
        raise ValueError(f"'{value}' {problem}" if problem.startswith("is") else problem)
    return value


def _port(text: str, where: str) -> None:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"port '{text}' in '{where}' is not a number")
    if len(text) > 5 or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {text} in '{where}' is out of range 1-65535")


def _bracketed_v6(text: str, where: str) -> None:
    """The address inside ``[...]`` of a host:port or a jump hop must be IPv6."""
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise ValueError(f"'[{text}]' in {where} is not an IPv6 address") from None


_HOST_PORT = re.compile(r"^(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:\[\]]+)):(?P<port>[^:]*)$")


def _monitor(value: str) -> str:
    """A Ceph monitor, ``host:port`` (``[2001:db8::1]:6789`` for IPv6)."""
    match = _HOST_PORT.match(value)
    if match is None and "," in value:
        raise ValueError(f"'{value}' is not host:port (one monitor per list item)")
    if match is None and value.count(":") > 1 and "[" not in value:
        raise ValueError(f"'{value}' is not host:port (an IPv6 address goes in brackets: [2001:db8::1]:6789)")
    if match is None:
        raise ValueError(f"'{value}' is not host:port (e.g. 10.0.2.1:6789)")
    _port(match["port"], value)
    if match["v6"] is not None:
        _bracketed_v6(match["v6"], f"'{value}'")
    else:
        _host(match["host"])
    return value


_HOP = re.compile(r"^(?:(?P<user>[^@]*)@)?(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^:@\[\]]*))(?::(?P<port>.*))?$")
_POSIX_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")


def _jump_host(value: str) -> str:
    """ssh ProxyJump: ``[user@]host[:port]``, several hops separated by commas."""
    for hop in value.split(","):
        match = _HOP.match(hop)
        if hop.count(":") > 1 and "[" not in hop:
            raise ValueError(f"hop '{hop}': an IPv6 address goes in brackets ([2001:db8::1]:22)")
        if not hop or match is None or not (match["host"] or match["v6"]):
            raise ValueError(f"hop '{hop}' is not [user@]host[:port]")
        if match["user"] is not None and not _POSIX_USER.match(match["user"]):
            raise ValueError(f"user '{match['user']}' in hop '{hop}' is not a valid user name")
        if match["v6"] is not None:
            _bracketed_v6(match["v6"], f"hop '{hop}'")
        else:
            problem = _host_problem(match["host"])
            if problem is not None:
                raise ValueError(f"host '{match['host']}' in hop '{hop}' {problem}")
        if match["port"] is not None:
            _port(match["port"], hop)
    return value


# OpenSSH public key types, and the number of length-prefixed fields in each one's key blob
SSH_KEY_TYPES: dict[str, int] = {
    "ssh-ed25519": 2,
    "ssh-rsa": 3,
    "ecdsa-sha2-nistp256": 3,
    "ecdsa-sha2-nistp384": 3,
    "ecdsa-sha2-nistp521": 3,
    "sk-ssh-ed25519@openssh.com": 3,
    "sk-ecdsa-sha2-nistp256@openssh.com": 4,
}


def _blob_fields(blob: bytes) -> list[bytes] | None:
    """An SSH key blob split into its length-prefixed fields (None unless they fill it exactly)."""
    fields = []
    offset = 0
    while offset < len(blob):
        if offset + 4 > len(blob):
            return None
        size = int.from_bytes(blob[offset : offset + 4], "big")
        offset += 4
        if offset + size > len(blob):
            return None
        fields.append(blob[offset : offset + size])
        offset += size
    return fields


def _ssh_public_key(value: str) -> str:
    """One OpenSSH public key: ``<type> <base64 blob> [comment]``, no options, nothing else."""
    parts = value.split(None, 2)
    kind = parts[0] if parts else ""
    if kind not in SSH_KEY_TYPES:
        if "=" in kind or "," in kind or '"' in kind:
            raise ValueError("authorized_keys options (from=, command=, ...) are not allowed before the key")
        raise ValueError(
            f"key type '{kind[:40]}' is not one of {', '.join(SSH_KEY_TYPES)} (expected '<type> <base64> [comment]')"
        )
    if len(parts) < 2:
        raise ValueError(f"the {kind} key has no key data (expected '<type> <base64> [comment]')")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the {kind} key data is not valid base64") from None
    fields = _blob_fields(blob)
    if not fields:
        raise ValueError(f"the {kind} key data is not an SSH key (truncated or damaged)")
    inner = fields[0].decode("ascii", "replace")
    if inner != kind:
        raise ValueError(f"the key data is a '{inner[:40]}' key, not '{kind}'")
    if len(fields) != SSH_KEY_TYPES[kind]:
        raise ValueError(f"the {kind} key data is not an SSH key (truncated or damaged)")
    if kind.startswith("ecdsa-") and fields[1].decode("ascii", "replace") != kind.rsplit("-", 1)[1]:
        raise ValueError(f"the {kind} key data names curve '{fields[1].decode('ascii', 'replace')[:20]}'")
    if kind.endswith("ed25519") and len(fields[1]) != 32:
        raise ValueError(f"the {kind} key data is not an SSH key (truncated or damaged)")
    comment = parts[2].split() if len(parts) > 2 else []
    if any(word in SSH_KEY_TYPES for word in comment):
        raise ValueError("holds more than one key: write one key per list item")
    return value


# an NTP server, an ssh host: a host name or an IPv4/IPv6 address
HostAddress = Annotated[str, StringConstraints(min_length=1, max_length=253), AfterValidator(_host)]
# a Ceph monitor: host:port
MonitorAddress = Annotated[str, StringConstraints(min_length=1, max_length=261), AfterValidator(_monitor)]
# ssh ProxyJump: [user@]host[:port][,[user@]host[:port]...]
JumpHost = Annotated[str, StringConstraints(min_length=1, max_length=1024), AfterValidator(_jump_host)]
# an OpenSSH key exchange algorithm (ssh -Q kex): those of OpenSSH 9.2 (Debian 12) and 10.0 (Debian 13)
KexAlgorithm = Literal[
    "mlkem768x25519-sha256",
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "ecdh-sha2-nistp256",
    "ecdh-sha2-nistp384",
    "ecdh-sha2-nistp521",
    "diffie-hellman-group-exchange-sha256",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group18-sha512",
    "diffie-hellman-group14-sha256",
]
# one line of authorized_keys: an OpenSSH public key of a known type, its blob checked
SshPublicKey = Annotated[str, StringConstraints(min_length=1, max_length=4096), AfterValidator(_ssh_public_key)]
# free text (descriptions): the generic rule applies; capped like every string
FreeText = Annotated[str, StringConstraints(max_length=4096)]


class Strict(BaseModel):
    """Every section rejects unknown keys: a typo must never pass silently."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)
