"""Model loads and residency of the simulated workers (mixed into
:class:`~argusdiff.simulator.engine.Simulator`, whose state it reads and changes).

A worker keeps up to ``max_resident_models`` models loaded (the live worker's ``[workers]
max_loaded_models``, least recently used evicted first) within its GPU's memory (the profile's
``gpu_memory_gb`` and each level's ``memory_gb``, when given). A plan level or a request whose
model is resident costs no load; otherwise the worker finishes its queued work, then loads for
the level's ``load_time_s``. A plan's ``preload`` levels load alongside, in the background.
"""

from __future__ import annotations

from argusdiff.domain import ApproxLevel
from argusdiff.simulator.events import ModelLoaded

__all__ = ["ModelResidency"]


class ModelResidency:
    """The simulated workers' model residency: what fits, what is evicted, when a model is ready."""

    def _fits(self, w: int, model: str, keep: set[str]) -> bool:
        """Whether ``model`` fits on ``w`` next to the resident models in ``keep``."""
        if len(keep) + 1 > self.cfg.max_resident_models:
            return False
        if self.gpu_memory is None:
            return True
        mem = self.model_memory
        used = sum(mem.get(m, 0.0) for m in sorted(keep))  # sorted: a set's order follows the hash seed
        return used + mem.get(model, 0.0) <= self.gpu_memory + 1e-9

    def _in_use(self, w: int, t: float) -> set[str]:
        """Models of batches on ``w`` that have not finished at ``t``."""
        return {self.levels[b.level].model for b in self.dq[w] if b.finish > t}

    def _make_room(self, w: int, model: str, keep: set[str]) -> bool:
        """Evict least recently used models of ``w`` outside ``keep`` until ``model`` fits."""
        res = self.resident[w]
        while True:
            current = set(res)
            if self._fits(w, model, current):
                return True
            victims = [m for m in res if m not in keep]
            if not victims:
                return False
            del res[victims[0]]

    def _need(self, w: int, level: ApproxLevel, t: float, *, warm: bool = False) -> float:
        """The time ``level``'s model is ready on ``w``: at once when resident, else after a load
        that waits for the worker's queued work (the old model may have to leave memory)."""
        res = self.resident[w]
        model = level.model
        if model in res:
            ready = res.pop(model)
            res[model] = ready  # most recently used
            return ready
        if warm:
            self._make_room(w, model, set(self.pinned[w]))
            res[model] = 0.0
            return 0.0
        start = max(t, self.free_at[w])
        # by ``start`` the queued work is done: only the plan's other models are worth keeping
        if not self._make_room(w, model, set(self.pinned[w]) - {model}):
            self._make_room(w, model, set())
        end = start + level.load_time_s
        res[model] = end
        self.loads.append((w, start, end, model))
        self.free_at[w] = end
        self.load_end[w] = end
        self.view.busy_until[self.wids[w]] = end
        return end

    def _preload(self, w: int, level: ApproxLevel, t: float, *, warm: bool = False) -> None:
        """Load ``level``'s model alongside the resident ones (background; the worker keeps
        serving) when GPU memory holds it next to the models the worker uses or plans."""
        res = self.resident[w]
        model = level.model
        if model in res:
            return
        keep = set(self.pinned[w]) | self._in_use(w, t)
        keep.discard(model)
        if not self._make_room(w, model, keep):
            return  # does not fit next to what the worker needs: loaded when first used instead
        if warm:
            res[model] = 0.0
            return
        end = t + level.load_time_s
        res[model] = end
        self.loads.append((w, t, end, model))
        self.load_end[w] = max(self.load_end[w], end)
        if self.replans_on_load:
            self._push(ModelLoaded(end, w, model))
