"""Why corectl's programs drained a node: the one format of the drain reasons they write into Slurm,
and its one parse.

    corectl-health: <check>: <message>       Slurm's health program (role slurm's hook)
    corectl-health: <check>: <message> (kept)  the same, for a failure the node keeps (hardware) until heal or resume
    corectl: needs hardware service (<check>) corectl heal gave up; nothing resumes it by itself
    corectl validation: <check>: <message>   a validation job of an idle node (corectl-validate)
    corectl burn-in: <message>               corectl health --burn-in (its check is nccl)
    corectl-epilog: <message>                the GPU handover left a process on a GPU

Every other reason (an operator's, an upgrade's, Slurm's own) is not corectl's: ``parse`` answers None.
A reason Slurm shows may end with `` [user@time]`` (scontrol show node): ``parse`` drops it.

This file is also shipped to the nodes (role slurm installs roles/slurm/files/corectl_drain_reason.py,
a link to it) for the programs there: the health hook, the metrics reader, the validation and the GPU
handover. So: the standard library only, Python 3.11, and a command line for the shell hook:

    corectl_drain_reason.py format health CHECK MESSAGE   print the reason
    corectl_drain_reason.py format kept CHECK MESSAGE     print the reason of a failure the node keeps
    corectl_drain_reason.py source REASON                 print its source (exit 1: not corectl's)
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from enum import StrEnum

# Slurm keeps longer reasons, but sinfo and squeue show far less; each program cuts its own to this.
MAX_LENGTH = 250
HEALTH_MESSAGE_MAX = 200  # the hook's message, its newlines as spaces


class Source(StrEnum):
    HEALTH = "health"
    SERVICE = "service"
    VALIDATION = "validation"
    BURN_IN = "burn-in"
    EPILOG = "epilog"


# each source's prefix: a reason that starts with one is corectl's, whatever follows
PREFIX = {
    Source.HEALTH: "corectl-health: ",
    Source.SERVICE: "corectl: needs hardware service (",
    Source.VALIDATION: "corectl validation: ",
    Source.BURN_IN: "corectl burn-in: ",
    Source.EPILOG: "corectl-epilog: ",
}
WITH_CHECK = (Source.HEALTH, Source.VALIDATION)
BURN_IN_CHECK = "nccl"  # burn-in runs the health checker's nccl check
KEPT = " (kept)"  # a health reason's end when the failure is one the node keeps (the checker's exit 3)
SLURM_STAMP = re.compile(r" \[[^\[\]]*@[^\[\]]*\]$")  # scontrol's " [root@2026-11-26T09:02:11]"


@dataclass(frozen=True)
class DrainReason:
    """One of corectl's drain reasons: who wrote it, the check it names ("" for the epilog's), and the rest
    (a validation's message may name its check itself: ``nccl-pair: ... (with dgx02)``, check "")."""

    source: Source
    check: str = ""
    message: str = ""
    kept: bool = False  # a health failure the node keeps (hardware) until corectl heal or resume

    def __str__(self) -> str:
        prefix = PREFIX[self.source]
        if self.source == Source.SERVICE:
            text = f"{prefix}{self.check})"
        elif self.source in WITH_CHECK and self.check:
            text = f"{prefix}{self.check}: {self.message}"
        else:
            text = f"{prefix}{self.message}"
        if self.kept:
            return text[: MAX_LENGTH - len(KEPT)] + KEPT
        return text[:MAX_LENGTH]

    @classmethod
    def health(cls, check: str, message: str, kept: bool = False) -> DrainReason:
        """The health hook's: the message on one line, at most HEALTH_MESSAGE_MAX characters."""
        return cls(Source.HEALTH, check, " ".join(message.splitlines())[:HEALTH_MESSAGE_MAX], kept)

    @property
    def persists(self) -> bool:
        """A drain nothing ends by itself (a kept health failure, heal's, a validation's, a burn-in's): the node is
        out of service until heal or an operator's resume."""
        return self.kept or self.source in (Source.SERVICE, Source.VALIDATION, Source.BURN_IN)

    @classmethod
    def service(cls, check: str) -> DrainReason:
        return cls(Source.SERVICE, check)

    @classmethod
    def burn_in(cls, message: str) -> DrainReason:
        return cls(Source.BURN_IN, BURN_IN_CHECK, message)

    @classmethod
    def epilog(cls, message: str) -> DrainReason:
        return cls(Source.EPILOG, "", message)

    @classmethod
    def parse(cls, reason: str) -> DrainReason | None:
        """The reason as corectl wrote it; None when corectl did not write it. The check is what stands
        before the first ": " (a check the hook named after its file may be any name), or the whole rest."""
        text = SLURM_STAMP.sub("", reason.strip())
        for source, prefix in PREFIX.items():
            if not (text + " ").startswith(prefix):  # the hook's "corectl-health: x: " loses its last space in Slurm
                continue
            rest = text[len(prefix) :]
            if source == Source.SERVICE:
                return cls(source, rest.partition(")")[0].strip())
            if source in WITH_CHECK:
                check, _, message = rest.partition(": ")
                kept = source == Source.HEALTH and message.endswith(KEPT)
                return cls(source, check.rstrip(":").strip(), message.removesuffix(KEPT) if kept else message, kept)
            return cls(source, BURN_IN_CHECK if source == Source.BURN_IN else "", rest)
        return None


def source_of(reason: str) -> Source | None:
    found = DrainReason.parse(reason)
    return found.source if found else None


def main(argv: list[str]) -> int:
    """The shell hook's way in (see the module's text)."""
    if len(argv) == 4 and argv[:2] in (["format", Source.HEALTH], ["format", "kept"]):
        print(DrainReason.health(argv[2], argv[3], kept=argv[1] == "kept"))
        return 0
    if len(argv) == 2 and argv[0] == "source":
        found = source_of(argv[1])
        if found is None:
            return 1
        print(found)
        return 0
    print(f"usage: {sys.argv[0]} format health|kept CHECK MESSAGE | source REASON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
