"""What every mode receives: the run's options, its folder, and the shared cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.stack import BenchCluster

__all__ = ["Context"]


@dataclass(kw_only=True)
class Context:
    #: Correctness only: a handful of iterations of everything, nothing judged.
    quick: bool
    #: Temp folder of this run (deployments, workspaces, logs).
    folder: Path
    #: Started on first use by the modes that need workers (P2, P3, P4, MEM).
    cluster: BenchCluster | None = None
    #: Which modes ran, for the memory mode's note.
    ran: list[str] = field(default_factory=list)
