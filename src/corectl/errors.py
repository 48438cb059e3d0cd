"""Errors that reach the operator as one line, never as a traceback."""

from __future__ import annotations


class CorectlError(Exception):
    """A user-facing failure: printed as-is, exit code ``exit_code``."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ValidationFailed(CorectlError):
    """cluster.yml is invalid; ``lines`` holds one ``file:line: path: message`` per problem."""

    exit_code = 2

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines
