"""Prompt-embedding indexes: which earlier prompts are nearest, and which latents each one has.

Two engines behind one interface (:class:`VectorIndex`):

- :class:`HnswIndex` — the embedded default. An HNSW graph (hnswlib, cosine) in process for
  sub-millisecond nearest-prompt search at 100k prompts, over a SQLite file that is the source of
  truth for everything else (prompt id, model, embedding, and per K: blob size, hits, last use).
  The graph is rebuilt from SQLite when the index opens, so a crash never leaves them apart.
- :class:`QdrantIndex` — Qdrant, embedded (``QdrantClient(path=...)``) or a server
  (``QdrantClient(url=...)``) through the same code; the payload holds the same fields. Embedded
  Qdrant searches by brute force (see docs/cache.md for the measured limit): run a Qdrant server
  above ~1,000 prompts, or use :class:`HnswIndex`.

Embeddings are L2-normalised on the way in; similarity is cosine similarity in [-1, 1].
Both classes are thread-safe (one lock per index). Heavy imports (hnswlib, qdrant_client) are lazy.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from argusdiff.errors import ConfigError
from cache.policy import LatentStat

__all__ = ["HnswIndex", "IndexEntry", "Neighbor", "QdrantIndex", "VectorIndex", "normalise"]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One indexed prompt: its model and the latents stored for it (K → stats)."""

    prompt_id: str
    model: str
    created_s: float
    latents: Mapping[int, LatentStat] = field(default_factory=dict)

    @property
    def ks(self) -> tuple[int, ...]:
        return tuple(sorted(self.latents))

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.latents.values())

    @property
    def hits(self) -> int:
        return sum(s.hits for s in self.latents.values())


@dataclass(frozen=True, slots=True)
class Neighbor:
    prompt_id: str
    similarity: float
    entry: IndexEntry


def normalise(embedding: np.ndarray | Sequence[float], dim: int | None = None) -> np.ndarray:
    """A 1-D float32 unit vector; ValueError for a wrong size, NaN or a zero vector."""
    v = np.asarray(embedding, dtype=np.float32).reshape(-1)
    if dim is not None and v.shape[0] != dim:
        raise ValueError(f"embedding has {v.shape[0]} dimensions, the index expects {dim}")
    if not np.isfinite(v).all():
        raise ValueError("embedding has NaN or infinite values")
    n = float(np.linalg.norm(v))
    if n == 0.0:
        raise ValueError("embedding is the zero vector")
    return v / n


@runtime_checkable
class VectorIndex(Protocol):
    dim: int
    description: str

    def add(self, prompt_id: str, embedding: np.ndarray, *, model: str, sizes: Mapping[int, int], now_s: float) -> None:
        """Index a prompt with latents at the keys of ``sizes`` (K → blob bytes)."""
        ...

    def add_many(self, items: Sequence[tuple[str, np.ndarray, str, Mapping[int, int], float]]) -> None:
        """Index many ``(prompt_id, embedding, model, sizes, now_s)`` at once."""
        ...

    def nearest(
        self,
        embedding: np.ndarray,
        *,
        model: str | None = None,
        k: int | None = None,
        min_similarity: float = -math.inf,
        limit: int = 1,
    ) -> list[Neighbor]:
        """Up to ``limit`` prompts, most similar first, with similarity > ``min_similarity``,
        made by ``model`` (any if None) and having a latent at ``k`` (any if None)."""
        ...

    def get(self, prompt_id: str) -> IndexEntry | None: ...

    def record_hit(self, prompt_id: str, k: int, now_s: float) -> None: ...

    def remove_latents(self, prompt_id: str, ks: Sequence[int]) -> None:
        """Forget latents; a prompt left with none is removed."""
        ...

    def remove(self, prompt_id: str) -> None: ...

    def entries(self) -> Iterator[IndexEntry]: ...

    def latent_stats(self) -> list[LatentStat]: ...

    def __len__(self) -> int: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


def new_prompt_id() -> str:
    return uuid.uuid4().hex


# --- HNSW over SQLite ---------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (
    label INTEGER PRIMARY KEY AUTOINCREMENT,
    prompt_id TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    created REAL NOT NULL,
    embedding BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS latents (
    prompt_id TEXT NOT NULL REFERENCES prompts(prompt_id) ON DELETE CASCADE,
    k INTEGER NOT NULL,
    size INTEGER NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    last_use REAL NOT NULL,
    PRIMARY KEY (prompt_id, k)
);
"""


@dataclass(slots=True)
class _Row:
    label: int
    model: str
    created: float
    latents: dict[int, list]  # k -> [size, hits, last_use]

    def entry(self, prompt_id: str) -> IndexEntry:
        return IndexEntry(
            prompt_id=prompt_id,
            model=self.model,
            created_s=self.created,
            latents={
                k: LatentStat(prompt_id, k, int(v[0]), int(v[1]), float(v[2])) for k, v in sorted(self.latents.items())
            },
        )


class HnswIndex:
    """HNSW graph (hnswlib, cosine) in memory; SQLite on disk is the source of truth.

    ``path`` is a folder (``index.sqlite`` inside) or None for a throw-away in-memory index.
    One process at a time may open a folder for writing (an exclusive ``flock`` on ``lock``): the
    graph lives in that process's memory, so a second writer would silently diverge. Use
    ``read_only=True`` to inspect a folder another process is serving from (a snapshot of it).
    """

    def __init__(
        self,
        path: str | Path | None,
        dim: int = 384,
        *,
        m: int = 16,
        ef_construction: int = 200,
        ef_search: int = 64,
        build_threads: int = 1,
        read_only: bool = False,
    ) -> None:
        import hnswlib

        if dim < 2:
            raise ConfigError(f"embedding_dim must be >= 2 (got {dim})")
        self.dim = int(dim)
        self._m, self._efc, self._ef = int(m), int(ef_construction), int(ef_search)
        self._threads = int(build_threads)
        self._lock = threading.RLock()
        self._snapshot: Path | None = None
        self._lock_fh = None
        self.read_only = bool(read_only)
        if path is None:
            db = ":memory:"
            self.description = "hnsw:memory"
        else:
            folder = Path(path).expanduser()
            folder.mkdir(parents=True, exist_ok=True)
            db = str(folder / "index.sqlite")
            self._snapshot = folder / "graph.hnsw"
            if not self.read_only:
                self._take_lock(folder)
            self.description = f"hnsw:{folder}"
        self._db = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")
        if db != ":memory:":
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(_SCHEMA)
        stored = self._db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
        if stored is None:
            self._db.execute("INSERT INTO meta(key, value) VALUES ('dim', ?)", (str(self.dim),))
        elif int(stored[0]) != self.dim:
            raise ConfigError(
                f"embedding_dim: the index at {path} holds {stored[0]}-dimensional embeddings, "
                f"the configuration says {self.dim} (clear the cache or fix the setting)"
            )
        self._hnswlib = hnswlib
        self.opened_from = "rebuild"  # or "snapshot"
        self._rebuild()

    # -- graph --
    def _new_graph(self, capacity: int):
        g = self._hnswlib.Index(space="cosine", dim=self.dim)
        g.init_index(max_elements=max(1024, capacity), ef_construction=self._efc, M=self._m, allow_replace_deleted=True)
        g.set_ef(self._ef)
        g.set_num_threads(1)
        return g

    def _state(self) -> str:
        """Changes whenever a prompt is added or removed: (AUTOINCREMENT sequence, row count)."""
        seq = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'prompts'").fetchone()
        count = self._db.execute("SELECT COUNT(*) FROM prompts").fetchone()[0]
        return f"{0 if seq is None else int(seq[0])}:{int(count)}"

    def _load_snapshot(self, ids: list[int], embs: list[np.ndarray]):
        """The graph saved by the last close()/checkpoint() brought up to date with SQLite.

        Returns ``(graph, how)`` — ``how`` is "snapshot" when SQLite has not changed since, or
        "snapshot+delta" when prompts added since were inserted and prompts removed since were
        marked deleted — or None when there is no usable snapshot.
        """
        if self._snapshot is None or not self._snapshot.is_file():
            return None
        saved = self._db.execute("SELECT value FROM meta WHERE key = 'graph_state'").fetchone()
        if saved is None:
            return None
        try:
            saved_seq = int(saved[0].split(":")[0])
            g = self._hnswlib.Index(space="cosine", dim=self.dim)
            g.load_index(str(self._snapshot), max_elements=max(1024, 2 * len(ids)), allow_replace_deleted=True)
            g.set_ef(self._ef)
            g.set_num_threads(1)
        except Exception:  # unreadable snapshot: rebuild from SQLite instead
            return None
        if saved[0] == self._state():
            return g, "snapshot"
        try:
            live = set(ids)
            for label in g.get_ids_list():
                if int(label) not in live:
                    with contextlib.suppress(RuntimeError):  # already marked deleted
                        g.mark_deleted(int(label))
            new = [i for i, label in enumerate(ids) if label > saved_seq]
            if new:
                need = g.get_current_count() + len(new)
                if need > g.get_max_elements():
                    g.resize_index(max(need, 2 * g.get_max_elements()))
                g.add_items(
                    np.vstack([embs[i] for i in new]),
                    np.asarray([ids[i] for i in new], dtype=np.int64),
                    num_threads=self._threads,
                    replace_deleted=True,
                )
        except Exception:
            return None
        return g, "snapshot+delta"

    def checkpoint(self) -> None:
        """Save the graph now, so a crash later recovers from here plus the SQLite delta."""
        self._writable()
        with self._lock:
            self._save_snapshot()

    def _save_snapshot(self) -> None:
        if self._snapshot is None:
            return
        tmp = self._snapshot.with_suffix(".tmp")
        try:
            self._graph.save_index(str(tmp))
            tmp.replace(self._snapshot)
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES ('graph_state', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (self._state(),),
            )
        except (OSError, RuntimeError, sqlite3.Error):
            tmp.unlink(missing_ok=True)  # the next open rebuilds from SQLite

    def _rebuild(self) -> None:
        """Load the graph snapshot if it matches SQLite, else rebuild the graph from SQLite;
        the payload mirror always comes from SQLite."""
        with self._lock:
            rows: dict[str, _Row] = {}
            labels: dict[int, str] = {}
            embs: list[np.ndarray] = []
            ids: list[int] = []
            for label, pid, model, created, emb in self._db.execute(
                "SELECT label, prompt_id, model, created, embedding FROM prompts ORDER BY label"
            ):
                rows[pid] = _Row(int(label), model, float(created), {})
                labels[int(label)] = pid
                embs.append(np.frombuffer(emb, dtype=np.float32))
                ids.append(int(label))
            for pid, k, size, hits, last_use in self._db.execute(
                "SELECT prompt_id, k, size, hits, last_use FROM latents"
            ):
                if pid in rows:
                    rows[pid].latents[int(k)] = [int(size), int(hits), float(last_use)]
            loaded = self._load_snapshot(ids, embs)
            if loaded is not None:
                graph, self.opened_from = loaded
            else:
                self.opened_from = "rebuild"
                graph = self._new_graph(2 * len(ids))
                if ids:
                    graph.add_items(np.vstack(embs), np.asarray(ids, dtype=np.int64), num_threads=self._threads)
            self._graph, self._rows, self._labels = graph, rows, labels

    def _search_graph(self, v: np.ndarray, n: int) -> list[tuple[int, float]]:
        try:
            labels, dists = self._graph.knn_query(v, k=n)
        except RuntimeError:
            # hnswlib could not find n live neighbours (many deleted nodes): search exhaustively.
            live = np.fromiter(self._labels.keys(), dtype=np.int64)
            sims = np.asarray(self._graph.get_items(live), dtype=np.float32) @ v
            order = np.argsort(-sims)[:n]
            return [(int(live[i]), float(sims[i])) for i in order]
        return [(int(lab), 1.0 - float(d)) for lab, d in zip(labels[0], dists[0], strict=True)]

    # -- interface --
    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def add(self, prompt_id: str, embedding: np.ndarray, *, model: str, sizes: Mapping[int, int], now_s: float) -> None:
        self.add_many([(prompt_id, embedding, model, sizes, now_s)])

    def add_many(self, items: Sequence[tuple[str, np.ndarray, str, Mapping[int, int], float]]) -> None:
        """Index many ``(prompt_id, embedding, model, sizes, now_s)`` in one transaction."""
        self._writable()
        rows = []
        for prompt_id, embedding, model, sizes, now_s in items:
            if not sizes:
                raise ValueError("a prompt is indexed with at least one latent")
            rows.append((prompt_id, normalise(embedding, self.dim), model, dict(sizes), float(now_s)))
        if not rows:
            return
        with self._lock:
            seen: set[str] = set()
            for prompt_id, *_ in rows:
                if prompt_id in self._rows or prompt_id in seen:
                    raise ValueError(f"prompt id {prompt_id} is already indexed")
                seen.add(prompt_id)
            labels: list[int] = []
            self._db.execute("BEGIN")
            try:
                for prompt_id, v, model, sizes, now_s in rows:
                    cur = self._db.execute(
                        "INSERT INTO prompts(prompt_id, model, created, embedding) VALUES (?, ?, ?, ?)",
                        (prompt_id, model, now_s, v.tobytes()),
                    )
                    labels.append(int(cur.lastrowid))
                    self._db.executemany(
                        "INSERT INTO latents(prompt_id, k, size, hits, last_use) VALUES (?, ?, ?, 0, ?)",
                        [(prompt_id, int(k), int(sz), now_s) for k, sz in sizes.items()],
                    )
                need = self._graph.get_current_count() + len(rows)
                if need > self._graph.get_max_elements():
                    self._graph.resize_index(max(need, 2 * self._graph.get_max_elements()))
                self._graph.add_items(
                    np.vstack([r[1] for r in rows]),
                    np.asarray(labels, dtype=np.int64),
                    num_threads=self._threads,
                    replace_deleted=True,
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            for label, (prompt_id, _, model, sizes, now_s) in zip(labels, rows, strict=True):
                self._rows[prompt_id] = _Row(
                    label, model, now_s, {int(k): [int(sz), 0, now_s] for k, sz in sizes.items()}
                )
                self._labels[label] = prompt_id

    def nearest(
        self,
        embedding: np.ndarray,
        *,
        model: str | None = None,
        k: int | None = None,
        min_similarity: float = -math.inf,
        limit: int = 1,
    ) -> list[Neighbor]:
        v = normalise(embedding, self.dim)
        with self._lock:
            live = len(self._rows)
            if live == 0 or limit < 1:
                return []
            n = min(live, max(8, 4 * limit))
            while True:
                found: list[Neighbor] = []
                exhausted = False  # reached a candidate at or below min_similarity
                for label, sim in self._search_graph(v, n):
                    if sim <= min_similarity:
                        exhausted = True
                        break
                    pid = self._labels.get(label)
                    row = self._rows.get(pid) if pid is not None else None
                    if (
                        row is None
                        or (model is not None and row.model != model)
                        or (k is not None and k not in row.latents)
                    ):
                        continue
                    found.append(Neighbor(pid, sim, row.entry(pid)))
                    if len(found) >= limit:
                        return found
                if exhausted or n >= live:
                    return found
                n = min(live, n * 4)  # every candidate qualified on similarity but not on model/K: look wider

    def get(self, prompt_id: str) -> IndexEntry | None:
        with self._lock:
            row = self._rows.get(prompt_id)
            return None if row is None else row.entry(prompt_id)

    def record_hit(self, prompt_id: str, k: int, now_s: float) -> None:
        self._writable()
        with self._lock:
            row = self._rows.get(prompt_id)
            if row is None or k not in row.latents:
                return
            self._db.execute(
                "UPDATE latents SET hits = hits + 1, last_use = ? WHERE prompt_id = ? AND k = ?",
                (float(now_s), prompt_id, int(k)),
            )
            row.latents[k][1] += 1
            row.latents[k][2] = float(now_s)

    def remove_latents(self, prompt_id: str, ks: Sequence[int]) -> None:
        self._writable()
        with self._lock:
            row = self._rows.get(prompt_id)
            if row is None:
                return
            self._db.executemany("DELETE FROM latents WHERE prompt_id = ? AND k = ?", [(prompt_id, int(k)) for k in ks])
            for k in ks:
                row.latents.pop(int(k), None)
            if not row.latents:
                self.remove(prompt_id)

    def remove(self, prompt_id: str) -> None:
        self._writable()
        with self._lock:
            row = self._rows.pop(prompt_id, None)
            self._db.execute("DELETE FROM prompts WHERE prompt_id = ?", (prompt_id,))
            if row is not None:
                self._labels.pop(row.label, None)
                self._graph.mark_deleted(row.label)

    def entries(self) -> Iterator[IndexEntry]:
        with self._lock:
            snapshot = [row.entry(pid) for pid, row in self._rows.items()]
        yield from snapshot

    def export_rows(self) -> list[tuple[IndexEntry, np.ndarray]]:
        """Every entry with its (unit) embedding, e.g. for a replication snapshot."""
        with self._lock:
            embs = {
                pid: np.frombuffer(emb, dtype=np.float32).copy()
                for pid, emb in self._db.execute("SELECT prompt_id, embedding FROM prompts")
            }
            return [(row.entry(pid), embs[pid]) for pid, row in self._rows.items() if pid in embs]

    def load_rows(self, rows: Sequence[tuple[IndexEntry, np.ndarray]]) -> int:
        """Index entries with their latents' hits and last use (a replication snapshot); entries
        already indexed are skipped. Returns the number added."""
        fresh = [(e, emb) for e, emb in rows if e.prompt_id not in self._rows and e.latents]
        if not fresh:
            return 0
        self.add_many(
            [
                (e.prompt_id, emb, e.model, {k: s.size_bytes for k, s in e.latents.items()}, e.created_s)
                for e, emb in fresh
            ]
        )
        with self._lock:
            self._db.executemany(
                "UPDATE latents SET hits = ?, last_use = ? WHERE prompt_id = ? AND k = ?",
                [(s.hits, s.last_use_s, e.prompt_id, k) for e, _ in fresh for k, s in e.latents.items()],
            )
            for e, _ in fresh:
                row = self._rows.get(e.prompt_id)
                if row is not None:
                    for k, s in e.latents.items():
                        row.latents[int(k)] = [int(s.size_bytes), int(s.hits), float(s.last_use_s)]
        return len(fresh)

    def latent_stats(self) -> list[LatentStat]:
        with self._lock:
            return [
                LatentStat(pid, k, int(v[0]), int(v[1]), float(v[2]))
                for pid, row in self._rows.items()
                for k, v in row.latents.items()
            ]

    def clear(self) -> None:
        self._writable()
        with self._lock:
            self._db.execute("DELETE FROM latents")
            self._db.execute("DELETE FROM prompts")
            self._graph = self._new_graph(1024)
            self._rows, self._labels = {}, {}

    def _take_lock(self, folder: Path) -> None:
        import fcntl

        fh = open(folder / "lock", "a+")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise ConfigError(
                f"cache index at {folder} is in use by another process (or another open index in this "
                "one); close it first, or open it read-only to inspect it"
            ) from None
        self._lock_fh = fh

    def _release_lock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()  # closing the file releases the flock
            self._lock_fh = None

    def _writable(self) -> None:
        if self.read_only:
            raise ConfigError(f"{self.description} is open read-only")

    def close(self) -> None:
        """Save the graph snapshot (so the next open skips the rebuild), close SQLite, unlock."""
        with self._lock:
            try:
                if not self.read_only:
                    self._save_snapshot()
                self._db.close()
            except sqlite3.ProgrammingError:  # already closed
                pass
            finally:
                self._release_lock()


# --- Qdrant -------------------------------------------------------------------------------------


def _payload_entry(payload: Mapping) -> IndexEntry:
    pid = payload["prompt_id"]
    lat = json.loads(payload.get("latents") or "{}")
    return IndexEntry(
        prompt_id=pid,
        model=payload["model"],
        created_s=float(payload.get("created", 0.0)),
        latents={
            int(k): LatentStat(pid, int(k), int(v["size"]), int(v["hits"]), float(v["last_use"]))
            for k, v in sorted(lat.items(), key=lambda kv: int(kv[0]))
        },
    )


def _latents_payload(entry: IndexEntry) -> dict:
    return {
        "ks": list(entry.ks),
        "latents": json.dumps(
            {str(k): {"size": s.size_bytes, "hits": s.hits, "last_use": s.last_use_s} for k, s in entry.latents.items()}
        ),
    }


class QdrantIndex:
    """Qdrant collection of prompt embeddings; one point per prompt, id = the prompt id (a UUID).

    Payload: ``prompt_id``, ``model``, ``created``, ``ks`` (list of K with a stored latent; the
    search filters on it) and ``latents`` (JSON: K → size, hits, last use). Exactly one of
    ``path`` (embedded) and ``url`` (server) is used; every other line is shared.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        dim: int = 384,
        *,
        url: str | None = None,
        api_key: str | None = None,
        collection: str = "argusdiff_latents",
        timeout_s: float = 5.0,
        client=None,
    ) -> None:
        from qdrant_client import QdrantClient, models

        self._models = models
        self.dim = int(dim)
        self.collection = collection
        self._lock = threading.RLock()
        if client is not None:
            self.client = client
            self.description = f"qdrant:{collection}"
        elif url:
            self.client = QdrantClient(url=url, api_key=api_key, timeout=max(1, math.ceil(timeout_s)))
            self.description = f"qdrant:{url}/{collection}"
        else:
            if path is None:
                self.client = QdrantClient(location=":memory:")
                self.description = f"qdrant:memory/{collection}"
            else:
                folder = Path(path).expanduser()
                folder.mkdir(parents=True, exist_ok=True)
                try:
                    self.client = QdrantClient(path=str(folder))
                except RuntimeError as exc:  # the embedded store is locked by another process
                    raise ConfigError(f"qdrant index at {folder}: {exc}") from None
                self.description = f"qdrant:{folder}/{collection}"
        if not self.client.collection_exists(collection):
            self.client.create_collection(
                collection, vectors_config=models.VectorParams(size=self.dim, distance=models.Distance.COSINE)
            )
            if url:  # payload indexes make filtered search fast on a server (embedded mode ignores them)
                for name, schema in (
                    ("model", models.PayloadSchemaType.KEYWORD),
                    ("ks", models.PayloadSchemaType.INTEGER),
                ):
                    self.client.create_payload_index(collection, field_name=name, field_schema=schema)
        else:
            size = self.client.get_collection(collection).config.params.vectors.size
            if int(size) != self.dim:
                raise ConfigError(
                    f"embedding_dim: Qdrant collection {collection!r} holds {size}-dimensional vectors, "
                    f"the configuration says {self.dim}"
                )

    def __len__(self) -> int:
        with self._lock:
            return int(self.client.count(self.collection, exact=True).count)

    def add(self, prompt_id: str, embedding: np.ndarray, *, model: str, sizes: Mapping[int, int], now_s: float) -> None:
        self.add_many([(prompt_id, embedding, model, sizes, now_s)])

    def add_many(self, items: Sequence[tuple[str, np.ndarray, str, Mapping[int, int], float]]) -> None:
        """Index many ``(prompt_id, embedding, model, sizes, now_s)``, upserted in batches of 512."""
        points = []
        for prompt_id, embedding, model, sizes, now_s in items:
            v = normalise(embedding, self.dim)
            if not sizes:
                raise ValueError("a prompt is indexed with at least one latent")
            entry = IndexEntry(
                prompt_id,
                model,
                float(now_s),
                {int(k): LatentStat(prompt_id, int(k), int(s), 0, float(now_s)) for k, s in sizes.items()},
            )
            payload = {"prompt_id": prompt_id, "model": model, "created": float(now_s), **_latents_payload(entry)}
            points.append(self._models.PointStruct(id=str(uuid.UUID(prompt_id)), vector=v.tolist(), payload=payload))
        with self._lock:
            for i in range(0, len(points), 512):
                self.client.upsert(self.collection, points=points[i : i + 512])

    def nearest(
        self,
        embedding: np.ndarray,
        *,
        model: str | None = None,
        k: int | None = None,
        min_similarity: float = -math.inf,
        limit: int = 1,
    ) -> list[Neighbor]:
        m = self._models
        v = normalise(embedding, self.dim)
        must = []
        if model is not None:
            must.append(m.FieldCondition(key="model", match=m.MatchValue(value=model)))
        if k is not None:
            must.append(m.FieldCondition(key="ks", match=m.MatchValue(value=int(k))))
        with self._lock:
            res = self.client.query_points(
                self.collection,
                query=v.tolist(),
                query_filter=m.Filter(must=must) if must else None,
                limit=int(limit),
                score_threshold=None if math.isinf(min_similarity) else float(min_similarity),
                with_payload=True,
            )
        out = []
        for p in res.points:
            sim = float(p.score)
            if sim <= min_similarity:  # Qdrant's threshold is inclusive; NIRVANA's is strict
                continue
            entry = _payload_entry(p.payload)
            out.append(Neighbor(entry.prompt_id, sim, entry))
        return out

    def get(self, prompt_id: str) -> IndexEntry | None:
        with self._lock:
            pts = self.client.retrieve(self.collection, ids=[str(uuid.UUID(prompt_id))], with_payload=True)
        return _payload_entry(pts[0].payload) if pts else None

    def _update(self, prompt_id: str, fn) -> None:
        with self._lock:
            entry = self.get(prompt_id)
            if entry is None:
                return
            lat = dict(entry.latents)
            fn(lat)
            pid = str(uuid.UUID(prompt_id))
            if not lat:
                self.client.delete(self.collection, points_selector=self._models.PointIdsList(points=[pid]))
                return
            new = IndexEntry(entry.prompt_id, entry.model, entry.created_s, lat)
            self.client.set_payload(self.collection, payload=_latents_payload(new), points=[pid])

    def record_hit(self, prompt_id: str, k: int, now_s: float) -> None:
        def bump(lat: dict) -> None:
            s = lat.get(k)
            if s is not None:
                lat[k] = LatentStat(s.prompt_id, s.k, s.size_bytes, s.hits + 1, float(now_s))

        self._update(prompt_id, bump)

    def remove_latents(self, prompt_id: str, ks: Sequence[int]) -> None:
        def drop(lat: dict) -> None:
            for k in ks:
                lat.pop(int(k), None)

        self._update(prompt_id, drop)

    def remove(self, prompt_id: str) -> None:
        with self._lock:
            self.client.delete(
                self.collection, points_selector=self._models.PointIdsList(points=[str(uuid.UUID(prompt_id))])
            )

    def entries(self) -> Iterator[IndexEntry]:
        offset = None
        while True:
            with self._lock:
                pts, offset = self.client.scroll(self.collection, limit=256, offset=offset, with_payload=True)
            for p in pts:
                yield _payload_entry(p.payload)
            if offset is None:
                return

    def latent_stats(self) -> list[LatentStat]:
        return [s for e in self.entries() for s in e.latents.values()]

    def clear(self) -> None:
        with self._lock:
            self.client.delete_collection(self.collection)
            self.client.create_collection(
                self.collection,
                vectors_config=self._models.VectorParams(size=self.dim, distance=self._models.Distance.COSINE),
            )

    def close(self) -> None:
        with self._lock:
            self.client.close()
