"""``QualityTable``: each prompt's quality at each approximation level.

One schema shared by the simulator (quality of a served request), the classifier trainer (labels:
each prompt's optimal level) and the profiling script (which writes measured tables).

File format (CSV, UTF-8): optional leading metadata lines ``# key: value`` (``metric``,
``source``, ``synthetic``, ``profile``), then a header ``prompt_id,prompt,<level id>...`` with the
level columns ordered slowest/best first, then one row per prompt with the metric's raw score at
each level (e.g. PickScore). Example::

    # metric: pickscore
    # source: measured with scripts/profile_models.py on 8xA100, 2026-11-22
    # synthetic: false
    # profile: sdxl-ac-a100
    prompt_id,prompt,sdxl-k0,sdxl-k5,sdxl-k10
    p0,"a red fox in the snow",21.3,21.1,20.2
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from argusdiff.errors import ConfigError

__all__ = ["QualityTable", "QualityTableError"]

_META_KEYS = ("metric", "source", "synthetic", "profile")


class QualityTableError(ConfigError):
    """A quality table is malformed or does not match the levels it is used with."""


@dataclass(frozen=True, eq=False)
class QualityTable:
    """Scores of ``len(prompts)`` prompts at ``len(level_ids)`` levels (slowest/best first)."""

    level_ids: tuple[str, ...]
    prompt_ids: tuple[str, ...]
    prompts: tuple[str, ...]
    scores: np.ndarray  # float64, shape (n_prompts, n_levels)
    metric: str = "pickscore"
    source: str = ""
    synthetic: bool = False
    profile: str | None = None
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, dtype=np.float64)
        object.__setattr__(self, "scores", scores)
        n, m = len(self.prompts), len(self.level_ids)
        if scores.shape != (n, m):
            raise QualityTableError(f"scores have shape {scores.shape}, expected ({n}, {m})")
        if len(self.prompt_ids) != n:
            raise QualityTableError("prompt_ids and prompts differ in length")
        if len(set(self.level_ids)) != m:
            raise QualityTableError(f"duplicate level ids: {self.level_ids}")
        if not np.all(np.isfinite(scores)):
            row = int(np.argwhere(~np.isfinite(scores))[0][0])
            raise QualityTableError(f"prompt {self.prompt_ids[row]!r} has a non-finite score")
        index = {pid: i for i, pid in enumerate(self.prompt_ids)}
        if len(index) != n:
            raise QualityTableError("duplicate prompt ids")
        object.__setattr__(self, "_index", index)

    def __len__(self) -> int:
        return len(self.prompts)

    def row(self, prompt_id: str) -> int:
        try:
            return self._index[prompt_id]
        except KeyError:
            raise QualityTableError(f"prompt id {prompt_id!r} is not in the quality table") from None

    def level_index(self, level_id: str) -> int:
        try:
            return self.level_ids.index(level_id)
        except ValueError:
            raise QualityTableError(
                f"level {level_id!r} is not in the quality table (levels: {', '.join(self.level_ids)})"
            ) from None

    def check_levels(self, level_ids: Sequence[str]) -> None:
        """Fail clearly when the table was made for other levels than ``level_ids``."""
        if tuple(level_ids) != self.level_ids:
            raise QualityTableError(
                f"quality table levels {list(self.level_ids)} do not match the profile's {list(level_ids)}"
            )

    def relative(self) -> np.ndarray:
        """Scores divided by each prompt's best score over the levels (1.0 = best level for it)."""
        best = self.scores.max(axis=1, keepdims=True)
        if np.any(best <= 0):
            raise QualityTableError("relative quality needs positive scores")
        return self.scores / best

    def optimal_levels(self, ratio: float = 0.9) -> np.ndarray:
        """Each prompt's optimal level index (ARGUS §4.1): the fastest level whose score is at
        least ``ratio`` × the prompt's best score over all levels."""
        if not 0.0 < ratio <= 1.0:
            raise QualityTableError(f"ratio must be in (0, 1], got {ratio}")
        ok = self.relative() >= ratio - 1e-12
        m = len(self.level_ids)
        # the last True along each row (levels are slowest first, so fastest acceptable)
        return (m - 1 - np.argmax(ok[:, ::-1], axis=1)).astype(np.int64)

    def subset(self, rows: Sequence[int] | np.ndarray) -> QualityTable:
        rows = np.asarray(rows, dtype=np.int64)
        return QualityTable(
            level_ids=self.level_ids,
            prompt_ids=tuple(self.prompt_ids[i] for i in rows),
            prompts=tuple(self.prompts[i] for i in rows),
            scores=self.scores[rows],
            metric=self.metric,
            source=self.source,
            synthetic=self.synthetic,
            profile=self.profile,
        )

    # ---- I/O -----------------------------------------------------------------------------

    def to_csv(self, path: str | Path) -> None:
        buf = io.StringIO()
        buf.write(f"# metric: {self.metric}\n")
        buf.write(f"# source: {self.source.replace(chr(10), ' ')}\n")
        buf.write(f"# synthetic: {'true' if self.synthetic else 'false'}\n")
        if self.profile:
            buf.write(f"# profile: {self.profile}\n")
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["prompt_id", "prompt", *self.level_ids])
        for pid, prompt, row in zip(self.prompt_ids, self.prompts, self.scores, strict=True):
            writer.writerow([pid, prompt, *(repr(float(x)) for x in row)])
        Path(path).write_text(buf.getvalue(), encoding="utf-8")

    @classmethod
    def from_csv(cls, path: str | Path) -> QualityTable:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise QualityTableError(f"{p}: quality table not found") from None
        meta: dict[str, str] = {}
        lines = text.splitlines(keepends=True)
        start = 0
        while start < len(lines) and lines[start].startswith("#"):
            key, _, value = lines[start][1:].partition(":")
            if key.strip() in _META_KEYS:
                meta[key.strip()] = value.strip()
            start += 1
        reader = csv.reader(io.StringIO("".join(lines[start:])))
        try:
            header = next(reader)
        except StopIteration:
            raise QualityTableError(f"{p}: no header line") from None
        if header[:2] != ["prompt_id", "prompt"] or len(header) < 3:
            raise QualityTableError(f"{p}:{start + 1}: header must be prompt_id,prompt,<level id>...; got {header}")
        levels = tuple(header[2:])
        ids, prompts, rows = [], [], []
        for lineno, rec in enumerate(reader, start=start + 2):
            if not rec:
                continue
            if len(rec) != len(header):
                raise QualityTableError(f"{p}:{lineno}: expected {len(header)} fields, got {len(rec)}")
            try:
                values = [float(x) for x in rec[2:]]
            except ValueError as exc:
                raise QualityTableError(f"{p}:{lineno}: bad score: {exc}") from None
            if not all(math.isfinite(v) for v in values):
                raise QualityTableError(f"{p}:{lineno}: scores must be finite")
            ids.append(rec[0])
            prompts.append(rec[1])
            rows.append(values)
        if not rows:
            raise QualityTableError(f"{p}: no prompts")
        try:
            return cls(
                level_ids=levels,
                prompt_ids=tuple(ids),
                prompts=tuple(prompts),
                scores=np.array(rows, dtype=np.float64),
                metric=meta.get("metric", "pickscore"),
                source=meta.get("source", str(p)),
                synthetic=meta.get("synthetic", "false").lower() == "true",
                profile=meta.get("profile") or None,
            )
        except QualityTableError as exc:
            raise QualityTableError(f"{p}: {exc}") from None
