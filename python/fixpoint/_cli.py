"""Finding and calling the ``fixpoint`` command."""

from __future__ import annotations

import collections
import datetime as _dt
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import BadInput, BinaryNotFound, FixpointError, InternalError, Interrupted, error_for_code

DateLike = Union[_dt.date, str]
PathLike = Union[str, "os.PathLike[str]"]

log = logging.getLogger("fixpoint")

#: Seconds a run has to roll back after an interrupt before it is killed.
INTERRUPT_GRACE = 60.0

_EXE = "fixpoint.exe" if os.name == "nt" else "fixpoint"


def find_binary() -> str:
    """The ``fixpoint`` command this package calls: ``$FIXPOINT_BIN``, else
    the one installed beside this Python (the wheel's), else the first on
    ``PATH``."""
    explicit = os.environ.get("FIXPOINT_BIN")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise BinaryNotFound(
            f"FIXPOINT_BIN={explicit} is not an executable file",
            hint="point FIXPOINT_BIN at the fixpoint binary, or unset it to use the installed one",
        )
    candidates = [sysconfig.get_path("scripts")]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        candidates.append(sysconfig.get_path("scripts", scheme=user_scheme))
    candidates.append(os.path.dirname(sys.executable))
    for folder in candidates:
        if folder:
            path = os.path.join(folder, _EXE)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    found = shutil.which(_EXE)
    if found:
        return found
    raise BinaryNotFound(
        "the fixpoint command was not found beside this Python nor on PATH",
        hint="install the package with `pip install .` from a fixpoint checkout, or set FIXPOINT_BIN to the binary",
    )


def date_arg(value: DateLike, what: str = "date") -> str:
    """A run date as fixpoint reads it: ``datetime.date`` (a datetime gives
    its own calendar date) or an ISO string, which fixpoint itself checks."""
    if isinstance(value, _dt.datetime):
        return value.date().isoformat()
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return value
    raise BadInput(
        f"{what} must be a datetime.date or a YYYY-MM-DD string, not {type(value).__name__} {value!r}",
        hint="pass e.g. datetime.date(2026, 10, 20) or '2026-10-20'",
        error_class="input",
    )


def path_arg(value: PathLike, what: str = "job") -> str:
    try:
        return os.fspath(value)
    except TypeError:
        raise BadInput(
            f"{what} must be a path (str or os.PathLike), not {type(value).__name__}",
            hint="pass the job file's path, e.g. 'jobs/orders.toml'",
            error_class="input",
        ) from None


class Result:
    """A finished command: its exit code, its JSON document (or ``None``) and the end of its stderr."""

    def __init__(self, command: List[str], exit_code: int, document: Optional[Dict[str, Any]], stderr: str) -> None:
        self.command = command
        self.exit_code = exit_code
        self.document = document
        self.stderr = stderr

    def error(self, report: Any = None) -> FixpointError:
        """The exception for this result's exit code, carrying fixpoint's error object."""
        cls = error_for_code(self.exit_code)
        err = (self.document or {}).get("error") if isinstance(self.document, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message", ""))
            hint = err.get("hint")
            error_class = err.get("class")
        else:
            err = None
            message, hint, error_class = _failure_from_report(self.document, self.exit_code, self.stderr)
        return cls(
            message,
            hint=hint,
            error_class=error_class,
            exit_code=self.exit_code,
            error=err,
            report=report,
            stderr=self.stderr,
            command=self.command,
        )


def _failure_from_report(doc: Optional[Dict[str, Any]], code: int, stderr: str) -> Tuple[str, Optional[str], Optional[str]]:
    """The message of a failure that printed its usual document (a backfill
    with a failed date, a failed proof, a lookback day that failed)."""
    if isinstance(doc, dict):
        for d in doc.get("dates") or []:
            e = d.get("error") if isinstance(d, dict) else None
            if e:
                return f"{d.get('run_date')}: {e.get('message', '')}", e.get("hint"), e.get("class")
        window = doc.get("window")
        if isinstance(window, dict):
            for d in window.get("days") or []:
                e = d.get("error")
                if e:
                    return f"{d.get('run_date')}: {e.get('message', '')}", e.get("hint"), e.get("class")
        if "proved" in doc:
            failures = doc.get("failures") or []
            return str(doc.get("verdict") or "; ".join(failures) or "the proof failed"), None, "proof"
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    if lines:
        return lines[-1][len("error: "):], None, None
    return f"fixpoint exited with code {code}", None, None


def invoke(
    args: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[PathLike] = None,
    timeout: Optional[float] = None,
    on_start: Optional[Callable[["subprocess.Popen[bytes]"], None]] = None,
) -> Result:
    """Runs ``fixpoint ARGS --output json``: stdout is read as its JSON
    document, stderr goes line by line to the ``fixpoint`` logger (its end is
    kept for error messages). A timeout (seconds) or a KeyboardInterrupt
    interrupts fixpoint as Ctrl-C does (what it had not committed is rolled
    back) and raises :class:`Interrupted`."""
    binary = find_binary()
    command = [binary, *args, "--output", "json"]
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=child_env, cwd=cwd)
    except OSError as e:
        raise BinaryNotFound(f"could not start {binary}: {e}", hint="check FIXPOINT_BIN or reinstall the package") from e
    if on_start is not None:
        on_start(proc)
    tail: "collections.deque[str]" = collections.deque(maxlen=200)
    out_chunks: List[bytes] = []

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(line)
            log.info("%s", line)

    def pump_stdout() -> None:
        assert proc.stdout is not None
        out_chunks.append(proc.stdout.read())

    readers = [threading.Thread(target=pump_stderr, daemon=True), threading.Thread(target=pump_stdout, daemon=True)]
    for t in readers:
        t.start()
    interrupted = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        interrupted = True
        interrupt(proc)
    except KeyboardInterrupt:
        interrupt(proc)
        raise
    for t in readers:
        t.join()
    stdout = b"".join(out_chunks).decode("utf-8", "replace").strip()
    stderr = "\n".join(tail)
    document: Optional[Dict[str, Any]] = None
    if stdout:
        try:
            parsed = json.loads(stdout)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            document = parsed
        elif proc.returncode in (0, 2, 3, 4, 5, 6):
            raise InternalError(
                f"fixpoint printed something that is not its JSON document (exit {proc.returncode}): {stdout[:200]}",
                exit_code=proc.returncode,
                stderr=stderr,
                command=command,
            )
    result = Result(command, proc.returncode, document, stderr)
    if interrupted:
        err = result.error()
        raise Interrupted(
            f"fixpoint did not finish within {timeout} s and was interrupted; what it had not committed was rolled back",
            hint="raise the timeout, or run the remaining dates again (committed ones are skipped)",
            error_class="interrupted",
            exit_code=proc.returncode,
            error=err.error,
            stderr=stderr,
            command=command,
        )
    if document is None:
        if proc.returncode == 0:
            raise InternalError("fixpoint printed no JSON document", exit_code=0, stderr=stderr, command=command)
        raise result.error()
    return result


def interrupt(proc: "subprocess.Popen[bytes]", grace: float = INTERRUPT_GRACE) -> None:
    """Interrupts fixpoint as Ctrl-C does (it rolls back and exits 130);
    kills it when it has not ended after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass
