"""Why the router sent an image where it did, in one sentence for the response (``why`` of each
image of the native endpoint): what the classifier read in the prompt, and what the plan (its
PASM row for that reading) and the policy's own rules made of it."""

from __future__ import annotations

from argusdiff.domain import Assignment, Plan, RouteReason

__all__ = ["explain"]


def explain(
    assignment: Assignment,
    plan: Plan,
    *,
    optimal: str | None,
    reads_prompt: bool,
    tier: str | None = None,
    classifier: str | None = None,
) -> str:
    """The reason for ``assignment`` under ``plan``: ``optimal`` is the classifier's level for the
    prompt (None: no classifier answered), ``reads_prompt`` whether the policy routes by it,
    ``classifier`` what the classifier is (e.g. fitted at start on synthetic labels)."""
    level = assignment.level
    if not reads_prompt:
        first = "this policy routes without reading the prompt"
    elif optimal is None:
        first = "no prompt classifier: the prompt counts as needing the best level"
    else:
        first = f"the prompt classifier{f' ({classifier})' if classifier else ''} puts this prompt at {optimal}"
    if assignment.cause is not RouteReason.PLAN:
        return f"{first}; {assignment.reason}: {level}"
    levels = plan.levels
    if level not in levels:
        return f"{first}; served at {level}"
    known = reads_prompt and optimal in levels
    row = levels.index(optimal) if known else 0
    col = levels.index(level)
    pasm = plan.pasm_for(tier)
    share = f" (P = {pasm[row][col]:.2f})" if row < len(pasm) and col < len(pasm[row]) else ""
    if not known:
        then = f"the plan's row for the best level sent it to {level}{share}"
    elif col == row:
        then = f"the plan serves {level}{share}"
    elif col < row:
        then = f"the plan has room at the better level {level}{share}"
    else:
        then = f"the plan is short of capacity at {optimal}: the faster level {level}{share}"
    return f"{first}; {then}"
