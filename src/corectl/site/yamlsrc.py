"""YAML loading that remembers where every key and item was written (for file:line errors).

cluster.yml is read by corectl alone and is never trusted as code or as an unbounded amount of
work. ``load`` refuses, each as one ``file:line: (yaml): ...`` error (or at the value's path) and
at once (while parsing, before any of it is built into Python objects):

- a file over ``MAX_BYTES`` (4 MiB), or one that is not UTF-8 text;
- more than one YAML document (``---`` twice), and special characters the YAML reader rejects;
- an alias bomb ("billion laughs"): anchors and aliases are counted as the tree they expand to,
  an alias costing the full size of its anchored node; over ``MAX_NODES`` (500,000) expanded
  values, over ``MAX_WRITTEN`` (250,000) values written, nesting deeper than ``MAX_DEPTH`` (64,
  aliases included) or an alias inside its own anchor is refused;
- any explicit tag but ``!!str`` (``!!python/object``, ``!!binary``, ``!!set``, ``!foo``: nothing in
  cluster.yml needs one, and they construct types the model never expects);
- a single value longer than ``MAX_SCALAR`` characters (4096; also keeps huge integers out).

The _Guard watches libyaml's events first (PyYAML's C parser, fast): an oversized document is
refused before ruamel's slow parser has read it. Where libyaml is missing or stops at a syntax
error, the _Guard watches ruamel's events instead (``_GuardedParser``).

The string rules that apply to every value once loaded (no Jinja markers, no control
characters) live in ``loader.py``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import TaggedScalar
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.parser import RoundTripParser
from ruamel.yaml.reader import ReaderError
from ruamel.yaml.scanner import RoundTripScanner

from corectl.errors import ValidationFailed

PathKey = tuple[str | int, ...]

# Limits, sized from measurements on a 2-core machine: ruamel's round-trip parser reads some
# 15,000 values (or 1.5 MiB of comments) a second, and expanding, checking and validating a value
# costs some 5 us. A site of 5,000 nodes written one by one has about 100,000 values and 1 MiB;
# node ranges (dgx[001-128]) keep real sites far below that.
MAX_BYTES = 4 * 1024 * 1024
MAX_WRITTEN = 250_000  # values (scalars, aliases, lists, mappings) written in the file
MAX_NODES = 500_000  # values once aliases are expanded (an alias counts as a copy of its anchor)
MAX_DEPTH = 64
MAX_SCALAR = 4096
_ALLOWED_TAGS = frozenset({"tag:yaml.org,2002:str"})  # `!!str 08:00`, the one tag a user may need

# a key part that can be shown bare in a dotted path; anything else is shown quoted and escaped
_BARE_KEY = re.compile(r"^[^\s\"\\\[\]\x00-\x1f\x7f-\x9f\u2028\u2029]+$")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(char: str) -> str:
    return repr(char)[1:-1]


def printable(text: str) -> str:
    """``text`` with control characters and line breaks written as escapes (one output line)."""
    return _UNPRINTABLE.sub(lambda m: _escape(m.group()), text)


def _key_char(char: str) -> str:
    if _UNPRINTABLE.match(char) or char.isspace():
        return _escape(char) if char != " " else "\\x20"
    return "\\" + char if char in '"\\' else char


def _quoted_key(key: str) -> str:
    return '["' + "".join(_key_char(c) for c in key) + '"]'


def dotted(path: PathKey) -> str:
    """``('nodes', 3, 'profile')`` -> ``nodes[3].profile`` (odd keys: ``environment["A\\x20B"]``)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _BARE_KEY.match(part):
            out += _quoted_key(part)
        else:
            out += f".{part}" if out else str(part)
    return out or "(document)"  # one word: every error line is `file:line: path: message`


@dataclass
class Source:
    """A loaded YAML document: plain Python data plus the line of each path."""

    file: Path
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)

    def line(self, path: PathKey) -> int:
        """The line of ``path``, or of its nearest written ancestor."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(tuple(path[:end]))
            if found is not None:
                return found
        return 1

    def error(self, path: PathKey, message: str) -> str:
        return f"{self.file}:{self.line(path)}: {dotted(path)}: {printable(message)}"


class _Refused(Exception):
    """The document breaks a resource or shape limit (reported as ``line: where: message``)."""

    def __init__(self, line: int, where: str, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.where = where
        self.message = message


@dataclass
class _Open:
    """A collection being parsed: its path, expanded size so far, height, and key state."""

    path: PathKey
    mapping: bool
    anchor: str | None
    size: int = 1
    height: int = 1
    index: int = 0
    key: str | None = None
    expect_key: bool = True


class _Guard:
    """Watches the parser's events as the composer takes them; raises _Refused at a limit.

    Counting happens on events, before nodes are composed or constructed, so an alias bomb stops
    after a few hundred events instead of after building (or expanding) the whole tree.
    """

    def __init__(self) -> None:
        self.open: list[_Open] = []
        # anchor -> (expanded size, height) once complete, or its _Open while still being parsed
        self.anchors: dict[str, tuple[int, int] | _Open] = {}
        self.total = 0
        self.written = 0
        self.documents = 0

    def _place(self) -> tuple[_Open | None, str | int | None]:
        """Advance the parent's key/index state for the node about to start: the parent and the
        node's key or index (None for a mapping key itself). Paths are built only when needed."""
        if not self.open:
            return None, None
        parent = self.open[-1]
        if not parent.mapping:
            parent.index += 1
            return parent, parent.index - 1
        if parent.expect_key:
            parent.expect_key = False
            parent.key = "?"
            return parent, None
        parent.expect_key = True
        return parent, parent.key

    @staticmethod
    def _path(parent: _Open | None, part: str | int | None) -> PathKey:
        if parent is None:
            return ()
        return (*parent.path, "?" if part is None else part)

    def _refuse_over(self, height: int, line: int) -> None:
        if self.written > MAX_WRITTEN:
            raise _Refused(line, "(yaml)", f"the document has more than {MAX_WRITTEN:,} values")
        if self.total > MAX_NODES:
            raise _Refused(
                line,
                "(yaml)",
                f"the document expands to more than {MAX_NODES:,} values "
                "(an alias counts as a copy of its anchored node: an alias bomb?)",
            )
        if len(self.open) + height > MAX_DEPTH:
            raise _Refused(line, "(yaml)", f"values are nested more than {MAX_DEPTH} levels deep")

    @staticmethod
    def _refuse_tag(tag: Any, path: PathKey, line: int) -> None:
        shown = str(tag).replace("tag:yaml.org,2002:", "!!", 1)
        raise _Refused(line, dotted(path), f"YAML tag '{shown}' is not allowed (write a plain or quoted value)")

    def see(self, event: Any) -> None:
        """Account for one event (ruamel's or PyYAML's: the classes share their names; ``tag`` is
        a str in both, None unless written)."""
        kind = type(event).__name__
        if kind == "ScalarEvent":
            parent, part = self._place()
            value = event.value
            if part is None and parent is not None:
                parent.key = part = str(value)
            if event.tag is not None and str(event.tag) not in _ALLOWED_TAGS:
                self._refuse_tag(event.tag, self._path(parent, part), event.start_mark.line + 1)
            if len(value) > MAX_SCALAR:
                where = dotted(self._path(parent, part))
                raise _Refused(
                    event.start_mark.line + 1, where, f"is longer than {MAX_SCALAR} characters ({len(value):,})"
                )
            if event.anchor is not None:
                self.anchors[event.anchor] = (1, 0)
            self._add(parent, 1, 0, event)
        elif kind in {"MappingStartEvent", "SequenceStartEvent"}:
            parent, part = self._place()
            path = self._path(parent, part)
            if event.tag is not None and str(event.tag) not in _ALLOWED_TAGS:
                self._refuse_tag(event.tag, path, event.start_mark.line + 1)
            self._add(parent, 1, 1, event)
            frame = _Open(path=path, mapping=kind == "MappingStartEvent", anchor=event.anchor)
            if event.anchor is not None:
                self.anchors[event.anchor] = frame
            self.open.append(frame)
        elif kind in {"MappingEndEvent", "SequenceEndEvent"} and self.open:
            frame = self.open.pop()
            # its start counted 1 toward the parent: add the rest of its expanded size
            if self.open:
                parent = self.open[-1]
                parent.size += frame.size - 1
                parent.height = max(parent.height, frame.height + 1)
            if frame.anchor is not None and self.anchors.get(frame.anchor) is frame:
                self.anchors[frame.anchor] = (frame.size, frame.height)
        elif kind == "AliasEvent":
            parent, _ = self._place()
            anchored = self.anchors.get(event.anchor, (1, 0))  # undefined: the parser says so
            if isinstance(anchored, _Open):
                raise _Refused(event.start_mark.line + 1, "(yaml)", f"alias *{event.anchor} is inside its own anchor")
            self._add(parent, *anchored, event)
        elif kind == "DocumentStartEvent":
            self.documents += 1
            if self.documents > 1:
                line = event.start_mark.line + 1
                raise _Refused(line, "(yaml)", "a second YAML document starts here (cluster.yml holds exactly one)")

    def _add(self, parent: _Open | None, size: int, height: int, event: Any) -> None:
        """Count a node written once, of ``size`` values and ``height`` levels once expanded."""
        self.written += 1
        self.total += size
        if self.written > MAX_WRITTEN or self.total > MAX_NODES or len(self.open) + height > MAX_DEPTH:
            self._refuse_over(height, event.start_mark.line + 1)
        if parent is not None:
            parent.size += size
            parent.height = max(parent.height, height + 1)


def _screen(text: str) -> bool:
    """The _Guard over libyaml's events (PyYAML's C parser), when it is there: a file that breaks
    a limit is refused in C parsing time, before ruamel's pure-Python parser (some 15,000 values a
    second) reads it. True: the whole document was screened and is within the limits.

    A syntax error here is left to ruamel (which reports it in its own words, or reads YAML 1.2
    that libyaml does not), and then ruamel's events go through a _Guard of their own."""
    if not getattr(pyyaml, "__with_libyaml__", False):
        return False
    guard = _Guard()
    try:
        for event in pyyaml.parse(text, Loader=pyyaml.CSafeLoader):
            guard.see(event)
    except pyyaml.YAMLError:
        return False
    return True


class _GuardedScanner(RoundTripScanner):
    """Stops at the ``MAX_DEPTH``-th nested ``[``/``{`` (ruamel scans ahead over every open one)."""

    def fetch_flow_collection_start(self, TokenClass: Any, to_push: str) -> None:
        if self.flow_level >= MAX_DEPTH:
            line = self.reader.get_mark().line + 1
            raise _Refused(line, "(yaml)", f"values are nested more than {MAX_DEPTH} levels deep")
        super().fetch_flow_collection_start(TokenClass, to_push)


class _GuardedParser(RoundTripParser):
    """ruamel's round-trip parser with every consumed event shown to a _Guard first."""

    def __init__(self, loader: Any = None) -> None:
        super().__init__(loader)
        self.guard = _Guard()

    def get_event(self) -> Any:
        event = super().get_event()
        if event is not None:
            self.guard.see(event)
        return event


def _position(node: Any, key: Any) -> int | None:
    """The 1-based line of ``key`` (or item index) in a ruamel node; None for merged keys."""
    data = getattr(getattr(node, "lc", None), "data", None)
    if not data:
        return None
    try:
        found = data.get(key)
    except TypeError:  # an unhashable key
        return None
    return found[0] + 1 if found else None


def _plain(node: Any, path: PathKey, lines: dict[PathKey, int]) -> Any:
    """Copy ruamel's round-trip nodes into builtins, recording line numbers (1-based)."""
    if isinstance(node, dict):
        out: dict[Any, Any] = {}
        for key, value in node.items():
            child = (*path, str(key))
            position = _position(node, key)
            if position is not None:
                lines[child] = position
            out[str(key)] = _plain(value, child, lines)
        return out
    if isinstance(node, list):
        items = []
        for index, value in enumerate(node):
            child = (*path, index)
            position = _position(node, index)
            if position is not None:
                lines[child] = position
            items.append(_plain(value, child, lines))
        return items
    if isinstance(node, TaggedScalar):  # `!!str value`, the only tag the guard lets through
        return str(node.value)
    # ruamel's scalar subclasses (ScalarInt, ScalarFloat, quoted strings) become builtins
    for kind in (bool, int, float, str):
        if isinstance(node, kind):
            return kind(node)
    return node


def _read(file: Path, shown: Path) -> str:
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ValidationFailed([f"{shown}:1: (file): not found"]) from None
    except OSError as exc:
        raise ValidationFailed([f"{shown}:1: (file): cannot be read: {printable(str(exc))}"]) from None
    if len(raw) > MAX_BYTES:
        raise ValidationFailed([f"{shown}:1: (yaml): the file is larger than {MAX_BYTES // 2**20} MiB"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = raw[exc.start]
        raise ValidationFailed(
            [f"{shown}:{line}: (yaml): not UTF-8 text (byte 0x{byte:02x} at column {column})"]
        ) from None


def load(file: Path, display: Path | None = None) -> Source:
    """Parse ``file``; syntax errors, duplicate keys and limits become one-line ValidationFailed errors."""
    shown = display or file
    text = _read(file, shown)
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    yaml.Scanner = _GuardedScanner
    try:
        # screened by libyaml: the same events again from ruamel need no second count (some 10%
        # of the load time of a big site); otherwise ruamel's parser is guarded instead
        yaml.Parser = RoundTripParser if _screen(text) else _GuardedParser
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. ruamel's ReusedAnchorWarning, printed to stderr
            data = yaml.load(text)
    except _Refused as exc:
        raise ValidationFailed([f"{shown}:{exc.line}: {exc.where}: {printable(exc.message)}"]) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise ValidationFailed([f"{shown}:{line}: (yaml): {printable(what)}"]) from None
    except ReaderError as exc:
        line = text[: exc.position].count("\n") + 1 if isinstance(exc.position, int) else 1
        what = str(exc.reason)
        if isinstance(exc.character, int):
            what = f"unacceptable character U+{exc.character:04X}: {exc.reason}"
        raise ValidationFailed([f"{shown}:{line}: (yaml): {printable(what)}"]) from None
    except YAMLError as exc:
        raise ValidationFailed([f"{shown}:1: (yaml): {printable(' '.join(str(exc).split()))}"]) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # a constructor failing on a value the parser accepted: still one line, never a traceback
        what = " ".join(str(exc).split()) or type(exc).__name__
        raise ValidationFailed([f"{shown}:1: (yaml): cannot be loaded: {printable(what)}"]) from None
    lines: dict[PathKey, int] = {(): 1}
    return Source(file=shown, data=_plain(data, (), lines), lines=lines)
