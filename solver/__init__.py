"""Allocation: ARGUS Eq. 1 (ILP) and its aggregated form, DiffServe's cascade MILP, ODA → PASM,
and the solver backends (HiGHS always, gurobipy when installed and licensed)."""

__all__ = ["DEFAULT_FORMULATION"]

#: The allocation formulation (ARGUS Eq. 1) when none is given: ``[solver] formulation``'s default,
#: which the service passes to its policy, the policies' option ``formulation`` and
#: :func:`solver.allocate.allocate`'s. ``exact`` (the branch and bound of :mod:`solver.exact`) is
#: the fast path for the control loop: docs/benchmarks.md (``scripts/bench_solver.py``) measures it
#: meeting the allocation + PASM target at 1,024 workers where the MILPs build a model per solve,
#: and it reaches the same optimal quality as the ``aggregated`` and ``paper`` MILPs
#: (tests/test_allocate.py checks it).
DEFAULT_FORMULATION = "exact"
