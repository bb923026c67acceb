"""Ensembles: DAGs of models scheduled as one model (Triton's ``platform: "ensemble"``).

* :mod:`inferd.ensemble.graph` - the wiring, built and checked at load.
* :mod:`inferd.ensemble.scheduler` - :class:`EnsembleScheduler`, the request path.
Loading one (reading its config, checking it against the composing models,
building its versions) is the repository's: :mod:`inferd.repository.ensembles`.
Nothing here imports the repository.
"""

from inferd.ensemble.graph import (
    Composing,
    EnsembleGraph,
    Step,
    build_graph,
    check_against_models,
    dependents,
    find_cycle,
    load_order,
)
from inferd.ensemble.scheduler import EnsembleScheduler

__all__ = [
    "Composing",
    "EnsembleGraph",
    "EnsembleScheduler",
    "Step",
    "build_graph",
    "check_against_models",
    "dependents",
    "find_cycle",
    "load_order",
]
