"""A page's screenshot in headless Chromium (Debian's package, /usr/bin/chromium) and what is on it:
the console errors Chromium logged, and where each exact colour lies in the PNG (read here: 8-bit
RGB/RGBA, non-interlaced, the form Chromium writes). The report's tests (unit stage and lab) use it."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1200, 2400
# Chromium's log lines that are the page's fault: a console message, an uncaught error, a load that failed
PAGE_ERRORS = re.compile(r"CONSOLE|Uncaught|Failed to load|net::ERR_|Refused to|Not allowed to load", re.IGNORECASE)


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    rows: list[bytes]  # RGB, 3 bytes a pixel

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        r, g, b = self.rows[y][3 * x : 3 * x + 3]
        return r, g, b


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def read_png(data: bytes) -> Image:
    """The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (alpha dropped)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            line[i] = (line[i] + (0, left, up, (left + up) // 2, _paeth(left, up, corner))[kind]) & 0xFF
        rows.append(bytes(line) if channels == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
        previous = line
    return Image(width, height, rows)


def rgb(colour: str) -> tuple[int, int, int]:
    """``#1f77b4`` as (31, 119, 180)."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def runs(image: Image, colour: str) -> list[tuple[int, int, int]]:
    """Every horizontal run of exactly ``colour``: (row, first x, length)."""
    wanted = bytes(rgb(colour))
    found = []
    for y, row in enumerate(image.rows):
        x = 0
        while (x := row.find(wanted, x)) >= 0:
            if x % 3:
                x += 1
                continue
            start = x
            while row[x : x + 3] == wanted:
                x += 3
            found.append((y, start // 3, (x - start) // 3))
    return found


def bars(image: Image, colour: str, min_height: int = 8) -> list[int]:
    """The lengths of the horizontal bars of ``colour``, top to bottom: a bar is rows (at least
    ``min_height``) next to each other that all hold a run of that colour starting at the same x."""
    longest: dict[int, int] = {}
    for y, _x, length in runs(image, colour):
        longest[y] = max(longest.get(y, 0), length)
    groups: list[tuple[int, int, int]] = []  # (last row, longest run, rows)
    for y in sorted(longest):
        if groups and groups[-1][0] == y - 1:
            groups[-1] = (y, max(groups[-1][1], longest[y]), groups[-1][2] + 1)
        else:
            groups.append((y, longest[y], 1))
    return [length for _y, length, height in groups if height >= min_height]


def screenshot(
    page: Path, png: Path, profile: Path, timeout: int = 120, height: int = HEIGHT
) -> tuple[Image, list[str]]:
    """Open ``page`` in headless Chromium and take its screenshot (WIDTH x ``height``, scale 1): the image
    and the lines of Chromium's log that are the page's errors."""
    argv = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--force-device-scale-factor=1",
        "--hide-scrollbars", f"--screenshot={png}", f"--window-size={WIDTH},{height}", page.resolve().as_uri(),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    log = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0 and png.is_file(), f"chromium exited {done.returncode}:\n" + "\n".join(log[-20:])
    return read_png(png.read_bytes()), [line for line in log if PAGE_ERRORS.search(line)]
