"""What the integrations read from a job file (its name, target and
strategy) to name and describe it; fixpoint itself validates the file when
it runs."""

from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .errors import BadInput

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover
    import tomli as _toml


@dataclass(frozen=True)
class JobInfo:
    path: str
    name: str
    target: str
    strategy: str
    partition: Optional[str]
    key: List[str]
    version: Optional[str]
    start: Optional[_dt.date]

    def guarantees(self) -> str:
        """The strategy's promise, in a sentence or two."""
        if self.strategy == "replace_partition":
            return (
                f"Each run replaces the run date's partition ({self.partition or 'the day'}) of {self.target} in one transaction: "
                "running a date again leaves exactly the rows of one clean run, a failed run leaves the previous rows, "
                "and rows of other dates are never touched. A rerun over the same input is skipped."
            )
        if self.strategy == "merge":
            keys = ", ".join(self.key) or "its key"
            newest = f", the newest {self.version} winning" if self.version else ""
            return (
                f"Each run upserts the date's batch into {self.target} on {keys}{newest}, after a deterministic dedup: "
                "reruns, retries and overlapping backfills leave the table as one run of each date; "
                "a failed run changes nothing."
            )
        if self.strategy == "history":
            keys = ", ".join(self.key) or "its key"
            return (
                f"Each run adds the date's versions to the history of {self.target} (SCD type 2, on {keys}): "
                "batches applied in any order and any number of times leave the same intervals; "
                "a failed run changes nothing."
            )
        return f"fixpoint job writing {self.target} with strategy {self.strategy}."


def read_job(path: "os.PathLike[str] | str") -> JobInfo:
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            doc: Dict[str, Any] = _toml.load(f)
    except FileNotFoundError:
        raise BadInput(f"job file {p} does not exist", hint="check the path (relative paths are from the working folder)", error_class="input") from None
    except (OSError, ValueError) as e:
        raise BadInput(f"job file {p} cannot be read: {e}", hint="fix the TOML; `fixpoint lint` names the problem", error_class="input") from None
    name, target = doc.get("name"), doc.get("target")
    if not isinstance(name, str) or not isinstance(target, str):
        raise BadInput(f"job file {p} has no `name` or no `target`", hint="every job names itself and its target table", error_class="input")
    merge = doc.get("merge") if isinstance(doc.get("merge"), dict) else {}
    key = doc.get("key", merge.get("key", []))
    if isinstance(key, str):
        key = [key]
    start = doc.get("start")
    if isinstance(start, str):
        start = _dt.date.fromisoformat(start)
    elif isinstance(start, _dt.datetime):
        start = start.date()
    return JobInfo(
        path=os.path.abspath(p),
        name=name,
        target=target,
        strategy=str(doc.get("strategy", "")),
        partition=doc.get("partition"),
        key=list(key) if isinstance(key, list) else [],
        version=doc.get("version", merge.get("version")),
        start=start if isinstance(start, _dt.date) else None,
    )
