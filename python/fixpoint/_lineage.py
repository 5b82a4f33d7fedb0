"""Parent runs for fixpoint's OpenLineage events, as the orchestrators name theirs."""

from __future__ import annotations

import uuid
from typing import Dict, Optional

_NS = uuid.UUID("6f1c3a52-3f0e-4f7b-9a40-5b1f0e6d9c11")


def static_run_id(*parts: object) -> str:
    """A UUID made from ``parts``: the same parts, the same id."""
    return str(uuid.uuid5(_NS, "\x1f".join(str(p) for p in parts)))


def parent_env(namespace: str, job_name: str, run_id: str, root: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``OPENLINEAGE_PARENT_ID`` (and ``OPENLINEAGE_ROOT_PARENT_ID``) for a child run."""
    env = {"OPENLINEAGE_PARENT_ID": f"{namespace}/{job_name}/{run_id}"}
    if root:
        env["OPENLINEAGE_ROOT_PARENT_ID"] = f"{root['namespace']}/{root['name']}/{root['run_id']}"
    return env
