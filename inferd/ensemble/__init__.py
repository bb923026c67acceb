"""Ensembles: DAGs of models scheduled as one model (Triton's ``platform: "ensemble"``).

* :mod:`inferd.ensemble.graph` - the wiring, built and checked at load.
* :mod:`inferd.ensemble.scheduler` - :class:`EnsembleScheduler`, the request path.
* :mod:`inferd.ensemble.loader` - what the ModelManager calls to load one
  (imported by the manager as a module, not from here, to keep imports acyclic).
"""

from inferd.ensemble.graph import (
    Composing,
    EnsembleGraph,
    Step,
    build_graph,
    check_against_models,
    check_ensemble_config,
    dependents,
    find_cycle,
    is_ensemble,
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
    "check_ensemble_config",
    "dependents",
    "find_cycle",
    "is_ensemble",
    "load_order",
]
