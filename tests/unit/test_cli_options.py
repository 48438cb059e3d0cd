"""Issue 31: every flag that more than one command takes is defined once, in cli/options.py.

A command module may define an option inline (``typer.Option(...)`` in its own signature) only
when no other command has a flag of that name: a second command that needs it takes it from
options.py (a ready ``...Opt`` or a factory such as ``seconds(help)``).
"""

from __future__ import annotations

import ast
from collections import defaultdict

from conftest import ROOT

CLI = ROOT / "src" / "corectl" / "cli"


def is_typer_option(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "Option"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "typer"
    )


def flags_of(call: ast.Call, parameter: str) -> list[str]:
    """The long flags a typer.Option call declares (typer derives one from the parameter's name
    when the call names none)."""
    named = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [flag for flag in named if flag.startswith("--")]
    return longs or ["--" + parameter.replace("_", "-")]


def inline_options() -> dict[str, list[str]]:
    """Flag -> where it is defined inline, over the command modules (options.py excluded)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(CLI.glob("*.py")):
        if path.name == "options.py":
            continue
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            for argument in function.args.args + function.args.kwonlyargs:
                for node in ast.walk(argument.annotation) if argument.annotation else ():
                    if is_typer_option(node):
                        assert isinstance(node, ast.Call)
                        for flag in flags_of(node, argument.arg):
                            found[flag].append(f"{path.name}:{function.name}")
    return found


def shared_flags() -> set[str]:
    """The flags options.py defines."""
    tree = ast.parse((CLI / "options.py").read_text())
    return {
        a.value
        for node in ast.walk(tree)
        if is_typer_option(node)
        for a in node.args  # type: ignore[attr-defined]
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
    }


def test_the_scan_sees_inline_and_shared_options():
    inline = inline_options()
    assert "--diff" in inline and "--partition" in inline  # provision's and add-node's own
    assert {"--inventory", "--limit", "--check", "--user", "--address", "--timeout"} <= shared_flags()


def test_no_flag_is_defined_twice():
    inline = inline_options()
    twice = {flag: where for flag, where in inline.items() if len(where) > 1}
    assert twice == {}, f"define these once in cli/options.py: {twice}"
    beside_shared = {flag: inline[flag] for flag in shared_flags() & inline.keys()}
    assert beside_shared == {}, f"these are in cli/options.py already: {beside_shared}"
