"""Airflow: :class:`FixpointOperator` runs a job for the task's date.

::

    from fixpoint.airflow import FixpointOperator

    load = FixpointOperator(task_id="load_orders", job="jobs/orders.toml", db="postgres://etl@db:5432/dw")

The date defaults to the start of the run's data interval
(``{{ data_interval_start | ds }}``): the day the run is about. Airflow's
``{{ ds }}`` is the logical date, which with Airflow 3's default timetable
is the day the run fires, not the day it loads. The run report (a dict, as
``fixpoint run --output json`` prints it) is the task's return value, so it
lands in XCom as ``return_value``.

A run the target already holds is skipped by fixpoint and the task
succeeds. With ``skip_when_done=True`` the task raises Airflow's skip
instead: note that under the default trigger rule (``all_success``) a
skipped task skips its downstream tasks too.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Sequence

try:  # Airflow 3
    from airflow.sdk import BaseOperator
except ImportError:  # Airflow 2
    from airflow.models import BaseOperator  # type: ignore[no-redef]

try:  # Airflow 3
    from airflow.sdk.exceptions import AirflowSkipException
except ImportError:  # Airflow 2
    from airflow.exceptions import AirflowSkipException  # type: ignore[no-redef]

from . import run as _run
from ._cli import interrupt
from ._lineage import parent_env, static_run_id

DEFAULT_DATE = "{{ data_interval_start | ds }}"


def _airflow_parent(context: Mapping[str, Any]) -> Dict[str, str]:
    """The task instance as the parent run of fixpoint's lineage events:
    the OpenLineage provider's ids when it is installed, else ids made the
    same way every time from the task instance."""
    ti = context["ti"]
    try:
        from airflow.providers.openlineage.plugins import macros

        env = {"OPENLINEAGE_PARENT_ID": macros.lineage_parent_id(ti)}
        root = getattr(macros, "lineage_root_parent_id", None)
        if root is not None:
            env["OPENLINEAGE_ROOT_PARENT_ID"] = root(ti)
        return env
    except Exception:
        pass
    namespace = os.environ.get("OPENLINEAGE_NAMESPACE", "default")
    run_id = static_run_id("airflow-task", ti.dag_id, ti.task_id, ti.run_id, ti.try_number, getattr(ti, "map_index", -1))
    root_id = static_run_id("airflow-dag-run", ti.dag_id, ti.run_id)
    return parent_env(namespace, f"{ti.dag_id}.{ti.task_id}", run_id, {"namespace": namespace, "name": ti.dag_id, "run_id": root_id})


class FixpointOperator(BaseOperator):
    """Runs a fixpoint job for one date (``fixpoint run``).

    :param job: the job file (templated).
    :param db: the database URL (templated); default: the worker's
        ``$FIXPOINT_DB``. A password in it never shows in the process list.
    :param date: the run date (templated); default: the start of the data interval.
    :param force: rewrite even when the target already holds the run's output.
    :param skip_when_done: raise Airflow's skip when fixpoint skipped the run.
    :param lineage: pass this task instance on as the parent of fixpoint's
        OpenLineage events (sent when ``OPENLINEAGE_URL`` is set or
        ``lineage_file`` is given).
    :param timeout: seconds before the run is interrupted (rolled back).
    """

    template_fields: Sequence[str] = ("job", "db", "date", "env")
    ui_color = "#d9f2e6"

    def __init__(
        self,
        *,
        job: str,
        db: Optional[str] = None,
        date: str = DEFAULT_DATE,
        force: bool = False,
        skip_when_done: bool = False,
        allow_nondeterministic: bool = False,
        no_wait: bool = False,
        lineage: bool = True,
        lineage_file: Optional[str] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job = job
        self.db = db
        self.date = date
        self.force = force
        self.skip_when_done = skip_when_done
        self.allow_nondeterministic = allow_nondeterministic
        self.no_wait = no_wait
        self.lineage = lineage
        self.lineage_file = lineage_file
        self.timeout = timeout
        self.env = dict(env or {})
        self._proc: Any = None

    def execute(self, context: Any) -> Dict[str, Any]:
        ti = context["ti"]
        env = dict(self.env)
        if self.lineage:
            env.update(_airflow_parent(context))
        report = _run(
            self.job,
            self.date,
            db=self.db,
            force=self.force,
            allow_nondeterministic=self.allow_nondeterministic,
            no_wait=self.no_wait,
            attempt=max(int(getattr(ti, "try_number", 1) or 1), 1),
            lineage_file=self.lineage_file,
            env=env,
            timeout=self.timeout,
            on_start=self._started,
        )
        self._proc = None
        self.log.info(
            "fixpoint %s %s %s: %s (%s), run key %s",
            report.job,
            report.run_date,
            report.target,
            report.outcome,
            report.skip_reason or report.method,
            report.run_key,
        )
        if report.skipped and self.skip_when_done:
            raise AirflowSkipException(f"{report.job} {report.run_date}: {report.skip_reason or 'already loaded'}")
        return report.raw

    def _started(self, proc: Any) -> None:
        self._proc = proc

    def on_kill(self) -> None:
        """Interrupts the run as Ctrl-C does: fixpoint rolls it back."""
        if self._proc is not None:
            interrupt(self._proc)
