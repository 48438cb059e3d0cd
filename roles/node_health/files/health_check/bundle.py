"""Writes the one file the role ships, ../corectl-health-check, from this package's modules:
the program's docstring (__main__.py), the standard-library imports of every module merged, then
each module's code in ORDER (a check's helpers before the registry that names it).

    python3 roles/node_health/files/health_check/bundle.py          write it
    python3 roles/node_health/files/health_check/bundle.py --check  exit 1 when it is stale
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "corectl-health-check"
ORDER = (
    "core", "sticky", "gpu", "fabric", "nvlink", "xid", "memory",
    "network", "storage", "services", "diagnostics", "nccl", "perftest", "checks",
)  # fmt: skip
MAIN = 'if __name__ == "__main__":\n    signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n    sys.exit(main())\n'


def split(path: Path) -> tuple[str, list[ast.stmt], str]:
    """A module's docstring, its top-level imports, and its code after them."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    last = max(node.end_lineno or node.lineno for node in imports)
    code = "\n".join(text.splitlines()[last:]).strip("\n")
    return ast.get_docstring(tree) or "", imports, code


def merged_imports(imports: list[ast.stmt]) -> list[str]:
    """The standard-library imports, sorted as ruff's isort does (plain imports, then from-imports)."""
    plain: set[str] = set()
    names: dict[str, set[str]] = {}
    for node in imports:
        if isinstance(node, ast.Import):
            plain.update(alias.name for alias in node.names)
        elif node.level == 0 and node.module != "__future__":
            names.setdefault(node.module or "", set()).update(alias.name for alias in node.names)
    lines = [f"import {name}" for name in sorted(plain)]
    lines += [f"from {module} import {', '.join(sorted(found))}" for module, found in sorted(names.items())]
    return lines


def bundle() -> str:
    program_doc = ast.get_docstring(ast.parse((HERE / "__main__.py").read_text(encoding="utf-8"))) or ""
    imports: list[ast.stmt] = []
    parts = []
    for name in ORDER:
        _doc, found, code = split(HERE / f"{name}.py")
        imports += found
        parts.append(f"# {'-' * 75} {name}.py\n\n\n{code}")
    head = (
        "#!/usr/bin/python3\n"
        f'"""{program_doc}\n\n'
        "Generated from roles/node_health/files/health_check/ by its bundle.py: edit the modules there.\n"
        '"""\n\n'
        "from __future__ import annotations\n\n"
    )
    return head + "\n".join(merged_imports(imports)) + "\n\n" + "\n\n\n".join(parts) + "\n\n\n" + MAIN


def main(argv: list[str]) -> int:
    text = bundle()
    if "--check" in argv:
        current = TARGET.read_text(encoding="utf-8") if TARGET.is_file() else ""
        if current != text:
            print(f"{TARGET}: stale; run python3 {Path(__file__)}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    TARGET.chmod(0o755)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
