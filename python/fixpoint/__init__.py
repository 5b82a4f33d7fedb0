"""fixpoint from Python: run data load jobs safe to re-run, and prove it.

Each function calls the ``fixpoint`` command installed with this package
(``--output json``) and returns its typed report; a failure raises the
exception of its exit code (:mod:`fixpoint.errors`), carrying fixpoint's
message and hint. ``db`` is a database URL (``duckdb:PATH``,
``postgres://…``); without it the command's own default applies
(``$FIXPOINT_DB``, else ``duckdb:fixpoint.duckdb`` in the working folder).
The URL is handed to the command in its environment, never on its command
line, so a password in it does not show in the process list.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._cli import DateLike, PathLike, Result, date_arg, find_binary, invoke, path_arg
from .errors import (
    AuditFailed,
    BadInput,
    BinaryNotFound,
    Busy,
    EngineError,
    FixpointError,
    InternalError,
    Interrupted,
    NotIdempotent,
    Refused,
)
from .reports import (
    AuditResult,
    BackfillDate,
    BackfillReport,
    DateStatus,
    DiffReport,
    ErrorInfo,
    Finding,
    Fingerprint,
    LedgerEntry,
    LintFile,
    LintReport,
    ProofReport,
    ProofRun,
    RunReport,
    StatusReport,
    Window,
    WindowDay,
)

__all__ = [
    "run",
    "backfill",
    "status",
    "runs",
    "prove",
    "diff",
    "lint",
    "fingerprint",
    "find_binary",
    "FixpointError",
    "EngineError",
    "BadInput",
    "Refused",
    "NotIdempotent",
    "Busy",
    "AuditFailed",
    "InternalError",
    "Interrupted",
    "BinaryNotFound",
    "RunReport",
    "BackfillReport",
    "BackfillDate",
    "StatusReport",
    "DateStatus",
    "LedgerEntry",
    "ProofReport",
    "ProofRun",
    "DiffReport",
    "LintReport",
    "LintFile",
    "Finding",
    "Fingerprint",
    "AuditResult",
    "ErrorInfo",
    "Window",
    "WindowDay",
]


def _env(db: Optional[str], attempt: Optional[int], extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
    env: Dict[str, str] = dict(extra or {})
    if db is not None:
        if not isinstance(db, str) or not db:
            raise BadInput(f"db must be a database URL string, not {db!r}", hint="e.g. 'duckdb:warehouse.duckdb' or 'postgres://user@host:5432/db'", error_class="input")
        env["FIXPOINT_DB"] = db
    if attempt is not None:
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise BadInput(f"attempt must be a positive integer, not {attempt!r}", hint="the scheduler's try number: 1 for the first try", error_class="input")
        env["FIXPOINT_ATTEMPT"] = str(attempt)
    return env


def _run_flags(force: bool, allow_nondeterministic: bool, no_wait: bool, lineage_file: Optional[PathLike]) -> List[str]:
    """The flags `run` and `backfill` share."""
    flags = [f for f, on in (("--force", force), ("--allow-nondeterministic", allow_nondeterministic), ("--no-wait", no_wait)) if on]
    if lineage_file is not None:
        flags += ["--lineage-file", path_arg(lineage_file, "lineage_file")]
    return flags


def run(
    job: PathLike,
    date: DateLike,
    db: Optional[str] = None,
    force: bool = False,
    *,
    allow_nondeterministic: bool = False,
    no_wait: bool = False,
    attempt: Optional[int] = None,
    lineage_file: Optional[PathLike] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
    timeout: Optional[float] = None,
    on_start: Optional[Callable[[Any], None]] = None,
) -> RunReport:
    """Runs ``job`` for ``date`` (``fixpoint run``). A run the target already
    holds is skipped (``report.skipped``); ``force`` rewrites it. ``attempt``
    is the scheduler's try number (it names the run in lineage events).
    Raises the exception of the exit code on failure; for a job with
    ``lookback`` whose window had a failed day, the exception's ``report``
    holds the window."""
    args = ["run", path_arg(job), "--date", date_arg(date), *_run_flags(force, allow_nondeterministic, no_wait, lineage_file)]
    r = invoke(args, env=_env(db, attempt, env), cwd=cwd, timeout=timeout, on_start=on_start)
    return _report_or_raise(r, RunReport.from_json)


def backfill(
    job: PathLike,
    start: DateLike,
    end: DateLike,
    db: Optional[str] = None,
    force: bool = False,
    *,
    parallel: int = 1,
    keep_going: bool = False,
    max_dates: Optional[int] = None,
    allow_nondeterministic: bool = False,
    no_wait: bool = False,
    attempt: Optional[int] = None,
    lineage_file: Optional[PathLike] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
    timeout: Optional[float] = None,
    on_start: Optional[Callable[[Any], None]] = None,
) -> BackfillReport:
    """Runs ``job`` for every date from ``start`` to ``end`` (inclusive),
    skipping the dates already done (``fixpoint backfill``). When a date
    fails, raises the exception of its exit code with the backfill's report
    as ``report`` (with ``keep_going``, after the other dates ran)."""
    args = ["backfill", path_arg(job), "--from", date_arg(start, "start"), "--to", date_arg(end, "end"), "--parallel", str(int(parallel))]
    args += _run_flags(force, allow_nondeterministic, no_wait, lineage_file)
    if keep_going:
        args.append("--keep-going")
    if max_dates is not None:
        args += ["--max-dates", str(int(max_dates))]
    r = invoke(args, env=_env(db, attempt, env), cwd=cwd, timeout=timeout, on_start=on_start)
    return _report_or_raise(r, BackfillReport.from_json)


def status(
    job: PathLike,
    db: Optional[str] = None,
    *,
    start: Optional[DateLike] = None,
    end: Optional[DateLike] = None,
    max_dates: Optional[int] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
) -> StatusReport:
    """Per date: loaded or missing, drift, source or job changed since
    (``fixpoint status``). Dates needing attention are a result, not an
    error: see ``report.need_attention``."""
    args = ["status", path_arg(job)]
    if start is not None:
        args += ["--from", date_arg(start, "start")]
    if end is not None:
        args += ["--to", date_arg(end, "end")]
    if max_dates is not None:
        args += ["--max-dates", str(int(max_dates))]
    r = invoke(args, env=_env(db, None, env), cwd=cwd)
    return _report_or_raise(r, StatusReport.from_json, results=(4,))


def runs(
    db: Optional[str] = None,
    *,
    job: Optional[str] = None,
    limit: int = 20,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
) -> List[LedgerEntry]:
    """The ledger's runs, newest first (``fixpoint runs``); ``job`` is the
    job's name (``name`` in its file)."""
    args = ["runs", "--limit", str(int(limit))]
    if job is not None:
        args += ["--job", job]
    r = invoke(args, env=_env(db, None, env), cwd=cwd)
    doc = _document_or_raise(r)
    return [LedgerEntry.from_json(e) for e in doc.get("runs") or []]


def prove(
    job: PathLike,
    date: DateLike,
    db: Optional[str] = None,
    *,
    runs: int = 2,
    crash: bool = False,
    mutate: bool = True,
    mutate_key: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
    timeout: Optional[float] = None,
) -> ProofReport:
    """Proves ``job`` idempotent for ``date`` (``fixpoint prove``): runs it
    ``runs`` times, with ``crash`` fails it at every step, and changes one
    input row in a sandbox. Raises :class:`NotIdempotent` (with the proof as
    ``report``) when a check fails."""
    args = ["prove", path_arg(job), "--date", date_arg(date), "--runs", str(int(runs))]
    if crash:
        args.append("--crash")
    if not mutate:
        args.append("--no-mutate")
    if mutate_key:
        args += ["--mutate-key", ",".join(f"{k}={v}" for k, v in mutate_key.items())]
    r = invoke(args, env=_env(db, None, env), cwd=cwd, timeout=timeout)
    return _report_or_raise(r, ProofReport.from_json)


def diff(
    table_a: str,
    table_b: str,
    key: Union[str, Sequence[str]],
    db: Optional[str] = None,
    *,
    db_b: Optional[str] = None,
    where: Optional[str] = None,
    exclude: Optional[Iterable[str]] = None,
    limit: int = 100,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
) -> DiffReport:
    """Compares two tables row by row (``fixpoint diff``). Differences are a
    result, not an error: see ``report.identical``."""
    keys = [key] if isinstance(key, str) else list(key)
    args = ["diff", table_a, table_b, "--key", ",".join(keys), "--limit", str(int(limit))]
    if where is not None:
        args += ["--where", where]
    if exclude:
        args += ["--exclude", ",".join(exclude)]
    if db_b is not None:
        args += ["--db-b", db_b]
    r = invoke(args, env=_env(db, None, env), cwd=cwd)
    return _report_or_raise(r, DiffReport.from_json, results=(4,))


def lint(
    *jobs: PathLike,
    dialect: str = "duckdb",
    deny_warnings: bool = False,
    db: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
) -> LintReport:
    """Lints job files (``fixpoint lint``). Findings are a result, not an
    error: see ``report.ok``, ``report.errors`` and each file's findings."""
    if not jobs:
        raise BadInput("lint needs at least one job file", hint="fixpoint.lint('jobs/orders.toml')", error_class="input")
    args = ["lint", *[path_arg(j) for j in jobs], "--dialect", dialect]
    if deny_warnings:
        args.append("--deny-warnings")
    if db is not None:
        args += ["--db", db]
    r = invoke(args, env=dict(env or {}), cwd=cwd)
    return _report_or_raise(r, LintReport.from_json, results=(2,))


def fingerprint(
    table: str,
    db: Optional[str] = None,
    *,
    where: Optional[str] = None,
    exclude: Optional[Iterable[str]] = None,
    portable: bool = False,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
) -> Fingerprint:
    """The row count and order-independent checksum of a table (``fixpoint fingerprint``)."""
    args = ["fingerprint", table]
    if where is not None:
        args += ["--where", where]
    if exclude:
        args += ["--exclude", ",".join(exclude)]
    if portable:
        args.append("--portable")
    r = invoke(args, env=_env(db, None, env), cwd=cwd)
    fp = Fingerprint.from_json(_document_or_raise(r))
    assert fp is not None
    return fp


def _document_or_raise(r: Result) -> Dict[str, Any]:
    doc = r.document or {}
    if r.exit_code != 0 or "error" in doc:
        raise r.error()
    return doc


def _report_or_raise(r: Result, parse: Callable[[Dict[str, Any]], Any], results: Sequence[int] = ()) -> Any:
    """The command's report; raises when it failed. ``results``: exit codes
    that are results of the command (status 4, diff 4, lint 2), not errors,
    when its usual document came with them."""
    doc = r.document or {}
    if isinstance(doc.get("error"), dict):
        # A run with lookback whose own date failed: the window comes with the error.
        raise r.error(Window.from_json(doc.get("window")))
    report = parse(doc)
    if r.exit_code == 0 or r.exit_code in results:
        return report
    raise r.error(report)
