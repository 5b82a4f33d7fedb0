"""Typed results of the ``fixpoint`` commands.

Each class mirrors one JSON document of ``fixpoint … --output json``
(docs/json.md). Every object keeps the document it was read from as ``raw``,
so keys added by a newer fixpoint are never lost.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

Row = Dict[str, Any]


def _date(v: Any) -> Optional[_dt.date]:
    return None if v is None else _dt.date.fromisoformat(v)


def _datetime(v: Any) -> Optional[_dt.datetime]:
    return None if v is None else _dt.datetime.fromisoformat(v)


def _int(d: Dict[str, Any], k: str) -> int:
    return int(d.get(k) or 0)


def _run_fields(d: Dict[str, Any]) -> Dict[str, Any]:
    """The fields a run's report and its ledger entry share."""
    return dict(
        job=str(d.get("job", "")),
        target=str(d.get("target", "")),
        strategy=str(d.get("strategy", "")),
        run_date=_dt.date.fromisoformat(d["run_date"]),
        outcome=str(d.get("outcome", "")),
        input=Fingerprint.from_json(d.get("input")),
        output=Fingerprint.from_json(d.get("output")),
        rows_deleted=_int(d, "rows_deleted"),
        rows_inserted=_int(d, "rows_inserted"),
        rows_updated=_int(d, "rows_updated"),
        rows_unchanged=_int(d, "rows_unchanged"),
        duplicates_collapsed=_int(d, "duplicates_collapsed"),
        audits=[AuditResult.from_json(a) for a in d.get("audits") or []],
        input_files=d.get("input_files"),
        raw=d,
    )


@dataclass(frozen=True)
class Fingerprint:
    """A row count and an order-independent checksum (``kind``: how it was made)."""

    rows: int
    checksum: str
    kind: str

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> Optional["Fingerprint"]:
        if d is None:
            return None
        return cls(rows=int(d["rows"]), checksum=str(d["checksum"]), kind=str(d["kind"]))


@dataclass(frozen=True)
class ErrorInfo:
    """fixpoint's error object: class, message, hint, exit code (and more keys in ``raw``)."""

    error_class: str
    message: str
    hint: Optional[str]
    exit_code: int
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> Optional["ErrorInfo"]:
        if d is None:
            return None
        return cls(
            error_class=str(d.get("class", "")),
            message=str(d.get("message", "")),
            hint=d.get("hint"),
            exit_code=int(d.get("exit_code", 0)),
            raw=d,
        )


@dataclass(frozen=True)
class AuditResult:
    """One audit's result in a run."""

    name: str
    severity: str
    passed: bool
    offending: int
    detail: Optional[str]
    sample: List[Row]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "AuditResult":
        return cls(
            name=str(d.get("name", "")),
            severity=str(d.get("severity", "")),
            passed=bool(d.get("passed")),
            offending=_int(d, "offending"),
            detail=d.get("detail"),
            sample=list(d.get("sample") or []),
        )


@dataclass(frozen=True)
class WindowDay:
    """One day of a lookback window."""

    run_date: _dt.date
    action: str
    reason: str
    report: Optional["RunReport"]
    error: Optional[ErrorInfo]


@dataclass(frozen=True)
class Window:
    """A lookback window: the days D-N … D, oldest first."""

    lookback: int
    days: List[WindowDay]
    written: int
    skipped: int
    failed: int

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> Optional["Window"]:
        if d is None:
            return None
        days = [
            WindowDay(
                run_date=_dt.date.fromisoformat(x["run_date"]),
                action=str(x.get("action", "")),
                reason=str(x.get("reason", "")),
                report=RunReport.from_json(x["report"]) if x.get("report") else None,
                error=ErrorInfo.from_json(x.get("error")),
            )
            for x in d.get("days") or []
        ]
        return cls(lookback=_int(d, "lookback"), days=days, written=_int(d, "written"), skipped=_int(d, "skipped"), failed=_int(d, "failed"))


@dataclass(frozen=True)
class RunReport:
    """What one run did (``fixpoint run``)."""

    job: str
    target: str
    strategy: str
    run_date: _dt.date
    run_key: Optional[str]
    outcome: str
    skip_reason: Optional[str]
    rows_deleted: int
    rows_inserted: int
    rows_updated: int
    rows_unchanged: int
    duplicates_collapsed: int
    input: Optional[Fingerprint]
    output: Optional[Fingerprint]
    created_target: bool
    method: str
    method_note: Optional[str]
    audits: List[AuditResult]
    input_files: Optional[Dict[str, Any]]
    elapsed_ms: int
    window: Optional[Window]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def committed(self) -> bool:
        """The run wrote the target (and the ledger)."""
        return self.outcome == "committed"

    @property
    def skipped(self) -> bool:
        """The target already held this run's output: nothing was written."""
        return self.outcome == "skipped"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RunReport":
        return cls(
            **_run_fields(d),
            run_key=d.get("run_key"),
            skip_reason=d.get("skip_reason"),
            created_target=bool(d.get("created_target")),
            method=str(d.get("method", "")),
            method_note=d.get("method_note"),
            elapsed_ms=_int(d, "elapsed_ms"),
            window=Window.from_json(d.get("window")),
        )


@dataclass(frozen=True)
class BackfillDate:
    """One date of a backfill: ``committed``, ``skipped``, ``failed`` or ``not_run``."""

    run_date: _dt.date
    outcome: str
    report: Optional[RunReport]
    error: Optional[ErrorInfo]


@dataclass(frozen=True)
class BackfillReport:
    """What a backfill did, date by date (``fixpoint backfill``)."""

    job: str
    dates: List[BackfillDate]
    committed: int
    skipped: int
    failed: int
    not_run: int
    rows_written: int
    exit_code: int
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BackfillReport":
        dates = [
            BackfillDate(
                run_date=_dt.date.fromisoformat(x["run_date"]),
                outcome=str(x.get("outcome", "")),
                report=RunReport.from_json(x["report"]) if x.get("report") else None,
                error=ErrorInfo.from_json(x.get("error")),
            )
            for x in d.get("dates") or []
        ]
        return cls(
            job=str(d.get("job", "")),
            dates=dates,
            committed=_int(d, "committed"),
            skipped=_int(d, "skipped"),
            failed=_int(d, "failed"),
            not_run=_int(d, "not_run"),
            rows_written=_int(d, "rows_written"),
            exit_code=_int(d, "exit_code"),
            raw=d,
        )


@dataclass(frozen=True)
class LedgerEntry:
    """A committed run as the ledger (``fixpoint.runs``) records it."""

    run_key: str
    job: str
    job_hash: str
    strategy: str
    target: str
    run_date: _dt.date
    outcome: str
    input: Optional[Fingerprint]
    output: Optional[Fingerprint]
    rows_deleted: int
    rows_inserted: int
    rows_updated: int
    rows_unchanged: int
    duplicates_collapsed: int
    started_at: Optional[_dt.datetime]
    finished_at: Optional[_dt.datetime]
    fixpoint_version: str
    audits: List[AuditResult]
    input_files: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "LedgerEntry":
        return cls(
            **_run_fields(d),
            run_key=str(d.get("run_key", "")),
            job_hash=str(d.get("job_hash", "")),
            started_at=_datetime(d.get("started_at")),
            finished_at=_datetime(d.get("finished_at")),
            fixpoint_version=str(d.get("fixpoint_version", "")),
        )


@dataclass(frozen=True)
class DateStatus:
    """One date of ``status``: ``ok``, ``missing``, ``drift``, ``source_changed``, ``job_changed`` or ``no_input``."""

    run_date: _dt.date
    state: str
    last_run: Optional[LedgerEntry]
    run_key_now: Optional[str]
    input_now: Optional[Fingerprint]
    output_now: Optional[Fingerprint]
    files_changed: List[str]
    note: Optional[str]


@dataclass(frozen=True)
class StatusReport:
    """Per date, loaded or not and whether it still holds what was loaded (``fixpoint status``)."""

    job: str
    dates: List[DateStatus]
    need_attention: int
    exit_code: int
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.need_attention == 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "StatusReport":
        dates = [
            DateStatus(
                run_date=_dt.date.fromisoformat(x["run_date"]),
                state=str(x.get("state", "")),
                last_run=LedgerEntry.from_json(x["last_run"]) if x.get("last_run") else None,
                run_key_now=x.get("run_key_now"),
                input_now=Fingerprint.from_json(x.get("input_now")),
                output_now=Fingerprint.from_json(x.get("output_now")),
                files_changed=list(x.get("files_changed") or []),
                note=x.get("note"),
            )
            for x in d.get("dates") or []
        ]
        return cls(job=str(d.get("job", "")), dates=dates, need_attention=_int(d, "need_attention"), exit_code=_int(d, "exit_code"), raw=d)


@dataclass(frozen=True)
class ProofRun:
    run: int
    run_key: Optional[str]
    output: Optional[Fingerprint]
    differs_from_first: List[Row]


@dataclass(frozen=True)
class ProofReport:
    """A proof of idempotence for one date (``fixpoint prove``)."""

    job: str
    run_date: _dt.date
    strategy: str
    scope: str
    before: Optional[Fingerprint]
    runs: List[ProofRun]
    crash: Optional[List[Dict[str, Any]]]
    order: Optional[Dict[str, Any]]
    mutation: Optional[Dict[str, Any]]
    proved: bool
    failures: List[str]
    verdict: str
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProofReport":
        runs = [
            ProofRun(
                run=_int(r, "run"),
                run_key=r.get("run_key"),
                output=Fingerprint.from_json(r.get("output")),
                differs_from_first=list(r.get("differs_from_first") or []),
            )
            for r in d.get("runs") or []
        ]
        return cls(
            job=str(d.get("job", "")),
            run_date=_dt.date.fromisoformat(d["run_date"]),
            strategy=str(d.get("strategy", "")),
            scope=str(d.get("scope", "")),
            before=Fingerprint.from_json(d.get("before")),
            runs=runs,
            crash=d.get("crash"),
            order=d.get("order"),
            mutation=d.get("mutation"),
            proved=bool(d.get("proved")),
            failures=list(d.get("failures") or []),
            verdict=str(d.get("verdict", "")),
            raw=d,
        )


@dataclass(frozen=True)
class DiffReport:
    """Two tables compared row by row (``fixpoint diff``)."""

    a: str
    b: str
    key: List[str]
    columns: List[str]
    method: str
    fingerprint_a: Optional[Fingerprint]
    fingerprint_b: Optional[Fingerprint]
    identical: bool
    note: Optional[str]
    only_in_a: int
    only_in_b: int
    changed: int
    only_in_a_rows: List[Row]
    only_in_b_rows: List[Row]
    changed_rows: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "DiffReport":
        return cls(
            a=str(d.get("a", "")),
            b=str(d.get("b", "")),
            key=list(d.get("key") or []),
            columns=list(d.get("columns") or []),
            method=str(d.get("method", "")),
            fingerprint_a=Fingerprint.from_json(d.get("fingerprint_a")),
            fingerprint_b=Fingerprint.from_json(d.get("fingerprint_b")),
            identical=bool(d.get("identical")),
            note=d.get("note"),
            only_in_a=_int(d, "only_in_a"),
            only_in_b=_int(d, "only_in_b"),
            changed=_int(d, "changed"),
            only_in_a_rows=list(d.get("only_in_a_rows") or []),
            only_in_b_rows=list(d.get("only_in_b_rows") or []),
            changed_rows=list(d.get("changed_rows") or []),
            raw=d,
        )


@dataclass(frozen=True)
class Finding:
    """One lint finding (``line``/``column`` in the job file, ``sql_line``/``sql_column`` in its SQL)."""

    rule: str
    severity: str
    line: Optional[int]
    column: Optional[int]
    sql_line: Optional[int]
    sql_column: Optional[int]
    message: str
    hint: Optional[str]


@dataclass(frozen=True)
class LintFile:
    file: str
    findings: Optional[List[Finding]]
    error: Optional[ErrorInfo]


@dataclass(frozen=True)
class LintReport:
    """What ``fixpoint lint`` found in each job file."""

    files: List[LintFile]
    errors: int
    warnings: int
    failed: int
    raw: Dict[str, Any] = field(repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """No error finding and every file linted (warnings allowed)."""
        return self.errors == 0 and self.failed == 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "LintReport":
        files = []
        for f in d.get("files") or []:
            findings = f.get("findings")
            files.append(
                LintFile(
                    file=str(f.get("file", "")),
                    findings=None
                    if findings is None
                    else [
                        Finding(
                            rule=str(x.get("rule", "")),
                            severity=str(x.get("severity", "")),
                            line=x.get("line"),
                            column=x.get("column"),
                            sql_line=x.get("sql_line"),
                            sql_column=x.get("sql_column"),
                            message=str(x.get("message", "")),
                            hint=x.get("hint"),
                        )
                        for x in findings
                    ],
                    error=ErrorInfo.from_json(f.get("error")),
                )
            )
        return cls(files=files, errors=_int(d, "errors"), warnings=_int(d, "warnings"), failed=_int(d, "failed"), raw=d)
