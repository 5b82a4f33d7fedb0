"""Exceptions: one class per exit code of the ``fixpoint`` command.

Every exception carries fixpoint's own error (``message``, ``hint``,
``error_class``, ``exit_code`` and the whole JSON object as ``error``), and,
when the command printed a document besides failing (a backfill with a
failed date, a proof that failed), that document parsed as ``report``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


class FixpointError(Exception):
    """Base class of every error raised by this package."""

    #: The exit code this class stands for (``None``: any other).
    code: Optional[int] = None

    def __init__(
        self,
        message: str,
        *,
        hint: Optional[str] = None,
        error_class: Optional[str] = None,
        exit_code: Optional[int] = None,
        error: Optional[Dict[str, Any]] = None,
        report: Any = None,
        stderr: str = "",
        command: Optional[list] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.error_class = error_class
        self.exit_code = exit_code if exit_code is not None else self.code
        self.error: Dict[str, Any] = dict(error or {})
        self.report = report
        self.stderr = stderr
        self.command = list(command or [])

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


class EngineError(FixpointError):
    """Exit 1: the database or the file system failed; a retry may work."""

    code = 1


class BadInput(FixpointError, ValueError):
    """Exit 2: the job file, an argument or a SQL text is wrong (or the
    engine lacks a capability the job needs)."""

    code = 2


class Refused(FixpointError):
    """Exit 3: a guard refused the source data; nothing changed."""

    code = 3


class NotIdempotent(FixpointError):
    """Exit 4 of ``prove``: the job is not idempotent (``report`` is the
    proof, with every failed check)."""

    code = 4


class Busy(FixpointError):
    """Exit 5: another process or run holds the database or the job's lock."""

    code = 5


class AuditFailed(FixpointError):
    """Exit 6: a blocking audit failed; nothing was published."""

    code = 6


class InternalError(FixpointError):
    """Exit 70, or output that is not fixpoint's JSON: a bug in fixpoint."""

    code = 70


class Interrupted(FixpointError):
    """Exit 130: the run was interrupted (Ctrl-C, or a timeout given to this
    package); what it had not committed was rolled back."""

    code = 130


class BinaryNotFound(FixpointError):
    """The ``fixpoint`` command is not installed where this package looks."""


_BY_CODE = {c.code: c for c in (EngineError, BadInput, Refused, NotIdempotent, Busy, AuditFailed, InternalError, Interrupted)}


def error_for_code(exit_code: int) -> type:
    """The exception class of an exit code (``FixpointError`` for an unknown one)."""
    return _BY_CODE.get(exit_code, FixpointError)
