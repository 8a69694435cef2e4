"""Allocation: ARGUS Eq. 1 (ILP) and its aggregated form, DiffServe's cascade MILP, ODA → PASM,
and the solver backends (HiGHS always, gurobipy when installed and licensed)."""
