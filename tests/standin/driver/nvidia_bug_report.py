#!/usr/bin/python3
"""Stand-in for nvidia-bug-report.sh (installed as /usr/bin/nvidia-bug-report.sh by the stand-in driver).

Like the real script it writes one gzip-compressed log, by default ./nvidia-bug-report.log.gz, with
`--output-file FILE` FILE.gz; what it holds here: a header, `nvidia-smi -q` and the (simulated) kernel
log, the two parts of the real report an operator reads first. Other options are accepted and ignored.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import time


def section(title: str, argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return f"____________________________________________\n\n{title}\n\n{done.stdout}{done.stderr}\n"


def main(argv: list[str]) -> int:
    output = "nvidia-bug-report.log"
    if "--output-file" in argv:
        index = argv.index("--output-file")
        if index + 1 >= len(argv):
            print("ERROR: --output-file needs a file name", file=sys.stderr)
            return 1
        output = argv[index + 1]
    text = f"Start of NVIDIA bug report log file.\nDate: {time.strftime('%a %b %d %H:%M:%S %Z %Y')}\n"
    text += section("nvidia-smi -q", ["nvidia-smi", "-q"])
    text += section("dmesg (the kernel log)", ["gpu-sim", "kernel-log"])
    with gzip.open(output + ".gz", "wt", encoding="utf-8") as out:
        out.write(text)
    print(f"complete.\n\nThe file {output}.gz has been created.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
