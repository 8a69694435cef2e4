"""One cache view for every process: the embedded HNSW index, fed by a Redis stream.

With several routers and workers on several machines, each process keeps its own in-memory
:class:`~cache.index.HnswIndex` (sub-millisecond lookups, no network hop on the request path), and
every change any of them makes goes through one Redis stream, ``ns:cache:log``:

* **writes** (:class:`ReplicatedIndex`): an insert (prompt id, model, unit embedding, latent
  sizes), a hit, an eviction of latents or of a prompt, a clear — appended to the stream *first*,
  then applied to the local index, under one per-process lock. A write Redis refuses fails as a
  whole (the latent cache turns it into :class:`~cache.api.CacheUnavailable`, the router's AC → SM
  signal), so no process holds an entry the others can never learn of.
* **reads**: a follower thread per process blocks on the stream (``XREAD BLOCK``) and applies what
  the other processes wrote, in stream order. Ops are idempotent (prompt ids are UUIDs: an insert
  of a known id, a removal of an unknown one are no-ops), so the replicas converge.
* **late joiners** load the newest snapshot (``ns:cache:snapshot``: the entries with their
  embeddings, in chunks, and the stream id they cover) and then read the stream after that id.
  Whichever process sees more than ``snapshot_every`` entries in the stream writes a new snapshot
  (one at a time: ``SET NX`` lock) and trims the stream up to the *previous* snapshot's id, so a
  joiner always has one snapshot interval to finish reading. A follower that finds entries after
  its position trimmed (the stream's first entry is past it) reloads from the snapshot.

Latent blobs are not in Redis: they live in the blob store every process shares (S3; a local
directory on one machine). A router needs only the index, for the cache similarity it routes by.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from cache.api import decode_embedding, encode_embedding
from cache.index import HnswIndex, IndexEntry, Neighbor, normalise
from cache.policy import LatentStat

__all__ = ["CacheLog", "ReplicatedIndex", "stream_id"]

log = logging.getLogger("argusdiff.cache")

SNAPSHOT_CHUNK = 1000  # entries per snapshot list element


def stream_id(text: Any) -> tuple[int, int]:
    """A stream entry id as a comparable pair."""
    s = text.decode() if isinstance(text, bytes) else str(text)
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class CacheLog:
    """The Redis side: the op stream and the snapshots (synchronous, thread-safe)."""

    def __init__(self, client: Any, namespace: str = "argusdiff") -> None:
        self.r = client
        self.stream = f"{namespace}:cache:log"
        self.pointer = f"{namespace}:cache:snapshot"
        self.gen_key = f"{namespace}:cache:snapshot:gen"
        self.lock = f"{namespace}:cache:snapshot:lock"
        self.ns = namespace

    @classmethod
    def from_url(cls, url: str, namespace: str = "argusdiff", timeout_s: float = 5.0) -> CacheLog:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return cls(client, namespace)

    def chunks_key(self, gen: int) -> str:
        return f"{self.ns}:cache:snapshot:{gen}"

    def append(self, op: Mapping[str, Any]) -> str:
        return _text(self.r.xadd(self.stream, {"op": json.dumps(op, separators=(",", ":"))}))

    def read(self, after: str, block_ms: int | None, count: int = 1000) -> list[tuple[str, dict]]:
        res = self.r.xread({self.stream: after}, count=count, block=block_ms)
        out = []
        for _stream, entries in res or []:
            for eid, fields in entries:
                raw = fields.get(b"op") or fields.get("op")
                out.append((_text(eid), json.loads(raw)))
        return out

    def length(self) -> int:
        return int(self.r.xlen(self.stream))

    def trimmed_past(self, position: str) -> bool:
        """Whether entries after ``position`` were trimmed (the follower must reload a snapshot)."""
        try:
            info = self.r.xinfo_stream(self.stream)
        except Exception:  # no stream yet
            return False
        # the log is only ever trimmed from its start (XTRIM MINID): entries are gone iff more were
        # added than are left, and those after ``position`` are gone iff the first one left is later
        added, left = int(info.get("entries-added") or 0), int(info.get("length") or 0)
        first = info.get("recorded-first-entry-id") or (info.get("first-entry") or [None])[0]
        return added > left and first is not None and stream_id(first) > stream_id(position)

    def read_snapshot(self) -> tuple[str, list[list]] | None:
        """(stream id it covers, rows) of the newest snapshot, or None."""
        for _ in range(5):
            raw = self.r.get(self.pointer)
            if raw is None:
                return None
            ptr = json.loads(raw)
            chunks = self.r.lrange(self.chunks_key(int(ptr["gen"])), 0, -1)
            if len(chunks) == int(ptr["chunks"]):
                return str(ptr["last_id"]), [row for c in chunks for row in json.loads(c)]
            time.sleep(0.01)  # replaced while we read it: read the new one
        raise RuntimeError("cache snapshot kept changing while it was read")

    def write_snapshot(self, rows: Sequence[list], last_id: str) -> int:
        """Store ``rows`` as the state at ``last_id``; trim the stream to the previous snapshot."""
        gen = int(self.r.incr(self.gen_key))
        key = self.chunks_key(gen)
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(key)
        chunks = 0
        for i in range(0, len(rows), SNAPSHOT_CHUNK):
            pipe.rpush(key, json.dumps(rows[i : i + SNAPSHOT_CHUNK], separators=(",", ":")))
            chunks += 1
        pipe.execute()
        prev_raw = self.r.get(self.pointer)
        prev = json.loads(prev_raw) if prev_raw else None
        ptr = {"gen": gen, "last_id": last_id, "chunks": chunks, "count": len(rows), "ts": time.time()}
        ptr["prev_last_id"] = prev["last_id"] if prev else None
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.pointer, json.dumps(ptr))
        if prev is not None:
            # keep what follows the previous snapshot: a joiner reading that one can still finish
            pipe.xtrim(self.stream, minid=prev["last_id"], approximate=False)
            if prev.get("gen") is not None:
                pipe.delete(self.chunks_key(int(prev["gen"]) - 1))
        pipe.execute()
        return gen


def _row(entry: IndexEntry, embedding: np.ndarray) -> list:
    return [
        entry.prompt_id,
        entry.model,
        entry.created_s,
        encode_embedding(embedding),
        {str(k): [s.size_bytes, s.hits, s.last_use_s] for k, s in entry.latents.items()},
    ]


def _entry(row: Sequence[Any], dim: int) -> tuple[IndexEntry, np.ndarray] | None:
    pid, model, created, emb, lat = row
    vec = decode_embedding(emb, dim)
    if vec is None:
        return None
    stats = {int(k): LatentStat(pid, int(k), int(v[0]), int(v[1]), float(v[2])) for k, v in lat.items()}
    return IndexEntry(pid, model, float(created), stats), vec


class ReplicatedIndex:
    """A :class:`~cache.index.VectorIndex` whose changes every replica sees (module doc)."""

    def __init__(
        self,
        local: HnswIndex,
        log_: CacheLog,
        *,
        origin: str | None = None,
        snapshot_every: int = 10_000,
        follow: bool = True,
        block_ms: int = 500,
    ) -> None:
        self.local = local
        self.log = log_
        self.dim = local.dim
        self.origin = origin or uuid.uuid4().hex[:12]
        self.snapshot_every = int(snapshot_every)
        self.block_ms = int(block_ms)
        self.description = f"{local.description} + redis stream {log_.stream}"
        self.position = "0-0"  # the last stream entry applied
        self.applied = 0
        self.reloads = 0
        self.snapshots = 0
        self.last_error: str | None = None
        self._write = threading.RLock()  # a local write and its log entry, vs. a snapshot
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.catch_up()
        if follow:
            self._thread = threading.Thread(target=self._follow, name="cache-replication", daemon=True)
            self._thread.start()

    # -- following the stream -------------------------------------------------------------------

    def _load_snapshot(self) -> None:
        snap = self.log.read_snapshot()
        with self._write:
            self.local.clear()
            if snap is None:
                self.position = "0-0"
                return
            last_id, rows = snap
            loaded = [e for e in (_entry(r, self.dim) for r in rows) if e is not None]
            self.local.load_rows(loaded)
            self.position = last_id

    def catch_up(self) -> int:
        """Load the snapshot when behind a trim, then apply the stream to its end; returns the
        entries applied (what a late joiner does before it serves)."""
        if self.position == "0-0" or self.log.trimmed_past(self.position):
            self._load_snapshot()
            self.reloads += 1
        n = 0
        while True:
            batch = self.log.read(self.position, None)
            if not batch:
                return n
            n += self._apply(batch)

    def _apply(self, batch: list[tuple[str, dict]]) -> int:
        with self._write:
            for eid, op in batch:
                if op.get("o") != self.origin:  # our own writes were applied when made
                    try:
                        self._apply_one(op)
                    except Exception as exc:  # a malformed entry must not stop the replica
                        log.warning("cache log entry %s not applied: %s", eid, exc)
                self.position = eid
            self.applied += len(batch)
        return len(batch)

    def _apply_one(self, op: dict) -> None:
        kind = op.get("op")
        local = self.local
        if kind == "add":
            rows = [_entry([pid, model, created, emb, {k: [s, 0, created] for k, s in sizes.items()}], self.dim)
                    for pid, model, created, emb, sizes in op["items"]]  # fmt: skip
            local.load_rows([r for r in rows if r is not None])
        elif kind == "hit":
            local.record_hit(op["pid"], int(op["k"]), float(op["t"]))
        elif kind == "rmk":
            local.remove_latents(op["pid"], [int(k) for k in op["ks"]])
        elif kind == "rm":
            local.remove(op["pid"])
        elif kind == "clear":
            local.clear()

    def _follow(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if self.log.trimmed_past(self.position):
                    log.warning("cache log trimmed past this replica's position: reloading the snapshot")
                    self._load_snapshot()
                    self.reloads += 1
                batch = self.log.read(self.position, self.block_ms)
                self._apply(batch)
                self.maybe_snapshot()
                self.last_error = None
                backoff = 0.05
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(backoff)
                backoff = min(2.0, backoff * 2)

    def maybe_snapshot(self, force: bool = False) -> bool:
        """Write a snapshot when the stream is longer than ``snapshot_every`` (one process at a time)."""
        if not force and self.log.length() <= self.snapshot_every:
            return False
        deadline = time.monotonic() + (10.0 if force else 0.0)
        while not self.log.r.set(self.log.lock, self.origin, nx=True, px=60_000):
            if time.monotonic() >= deadline:
                return False  # another process is writing one
            time.sleep(0.01)
        try:
            with self._write:  # writers wait; apply everything logged so far, then copy
                while batch := self.log.read(self.position, None):
                    self._apply(batch)
                rows = [_row(e, emb) for e, emb in self.local.export_rows()]
                position = self.position
            self.log.write_snapshot(rows, position)
            self.snapshots += 1
            return True
        finally:
            self.log.r.delete(self.log.lock)

    # -- writes: the log first, then this replica ----------------------------------------------

    def _logged(self, op: dict, apply: Any) -> Any:
        with self._write:
            self.log.append({**op, "o": self.origin})
            return apply()

    def add(self, prompt_id: str, embedding: np.ndarray, *, model: str, sizes: Mapping[int, int], now_s: float) -> None:
        self.add_many([(prompt_id, embedding, model, sizes, now_s)])

    def add_many(self, items: Sequence[tuple[str, np.ndarray, str, Mapping[int, int], float]]) -> None:
        rows = [
            (pid, normalise(emb, self.dim), model, dict(sizes), float(now)) for pid, emb, model, sizes, now in items
        ]
        if not rows:
            return
        op = {
            "op": "add",
            "items": [
                [pid, model, now, encode_embedding(v), {str(k): int(s) for k, s in sizes.items()}]
                for pid, v, model, sizes, now in rows
            ],
        }
        self._logged(op, lambda: self.local.add_many(rows))

    def record_hit(self, prompt_id: str, k: int, now_s: float) -> None:
        self._logged({"op": "hit", "pid": prompt_id, "k": int(k), "t": float(now_s)},
                     lambda: self.local.record_hit(prompt_id, k, now_s))  # fmt: skip

    def remove_latents(self, prompt_id: str, ks: Sequence[int]) -> None:
        ks = [int(k) for k in ks]
        self._logged({"op": "rmk", "pid": prompt_id, "ks": ks}, lambda: self.local.remove_latents(prompt_id, ks))

    def remove(self, prompt_id: str) -> None:
        self._logged({"op": "rm", "pid": prompt_id}, lambda: self.local.remove(prompt_id))

    def clear(self) -> None:
        self._logged({"op": "clear"}, self.local.clear)

    # -- reads: this replica ---------------------------------------------------------------------

    def nearest(self, embedding: np.ndarray, **kwargs: Any) -> list[Neighbor]:
        return self.local.nearest(embedding, **kwargs)

    def get(self, prompt_id: str) -> IndexEntry | None:
        return self.local.get(prompt_id)

    def entries(self) -> Iterator[IndexEntry]:
        return self.local.entries()

    def latent_stats(self) -> list[LatentStat]:
        return self.local.latent_stats()

    def __len__(self) -> int:
        return len(self.local)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.block_ms / 1000 + 5)
        self.local.close()
