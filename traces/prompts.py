"""Prompt sets: a trace's prompt indices index into one of these.

Sources:

* ``diffusiondb`` (the default, ``[traces] prompts``) — :func:`diffusiondb_prompts`: the first
  5,000 prompts of DiffusionDB 2M (real user prompts, in their order, repeats kept; CC0 1.0), shipped
  with the package with their MiniLM embeddings (``traces/data/SOURCES.md``), so ``replay`` runs
  on real prompts with nothing else;
* ``builtin`` — :func:`builtin_prompts`: 6,000 prompts generated deterministically from templates
  over eight kinds of request (simple scenes, landscapes, styled art, portraits, text rendering,
  counting, spatial composition, detail-heavy art). They are generated text, not user prompts;
  each carries its template kind as ``category``.
* a text file — one prompt per line (e.g. DiffusionDB's ``diffusiondb_2m_first_5k.txt``); blank
  lines are skipped, surrounding whitespace is stripped;
* a TSV/CSV file with a header that has a ``prompt`` column (any case), and optionally ``id`` /
  ``prompt_id``, ``category`` and ``challenge`` columns — e.g. PartiPrompts
  (``Prompt, Category, Challenge, Note``), or a QualityTable CSV (its ``# key: value`` lines are
  skipped);
* a headerless TSV — the first column is the prompt.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from argusdiff.errors import ConfigError

__all__ = [
    "BUILTIN_SIZE",
    "DIFFUSIONDB_FILE",
    "PromptSet",
    "PromptSetError",
    "builtin_prompts",
    "diffusiondb_prompts",
    "list_prompt_sets",
    "load_prompts",
]

BUILTIN_SIZE = 6000
#: the packaged DiffusionDB sample (a copy of DiffusionDB 2M's first 5,000 prompts)
DIFFUSIONDB_FILE = Path(__file__).resolve().parent / "data" / "diffusiondb_2m_first_5k.txt"
DIFFUSIONDB_SOURCE = (
    "DiffusionDB 2M (Wang et al., ACL 2023, poloclub/diffusiondb), first 5,000 prompts, CC0 1.0; "
    "packaged (traces/data/SOURCES.md)"
)


class PromptSetError(ConfigError):
    """A prompt file is missing or malformed (the message names the file and line)."""


@dataclass(frozen=True, eq=False)
class PromptSet:
    """An ordered set of prompts with ids and optional category/challenge labels."""

    prompts: tuple[str, ...]
    ids: tuple[str, ...]
    name: str = ""
    source: str = ""
    categories: tuple[str, ...] | None = None
    challenges: tuple[str, ...] | None = None
    generated: bool = False  # True for template-generated prompts (not real user text)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        if n == 0:
            raise PromptSetError(f"prompt set {self.name!r} is empty")
        if len(self.ids) != n:
            raise PromptSetError(f"prompt set {self.name!r}: {len(self.ids)} ids for {n} prompts")
        if len(set(self.ids)) != n:
            raise PromptSetError(f"prompt set {self.name!r}: duplicate prompt ids")
        for label, values in (("categories", self.categories), ("challenges", self.challenges)):
            if values is not None and len(values) != n:
                raise PromptSetError(f"prompt set {self.name!r}: {len(values)} {label} for {n} prompts")

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> str:
        return self.prompts[i]

    def __iter__(self):
        return iter(self.prompts)

    def subset(self, rows: Sequence[int] | np.ndarray, name: str | None = None) -> PromptSet:
        rows = [int(i) for i in rows]
        return PromptSet(
            prompts=tuple(self.prompts[i] for i in rows),
            ids=tuple(self.ids[i] for i in rows),
            name=self.name if name is None else name,
            source=self.source,
            categories=None if self.categories is None else tuple(self.categories[i] for i in rows),
            challenges=None if self.challenges is None else tuple(self.challenges[i] for i in rows),
            generated=self.generated,
        )

    def head(self, n: int) -> PromptSet:
        return self.subset(range(min(n, len(self))))

    def sample(self, n: int, *, seed: int = 0) -> PromptSet:
        """``n`` distinct prompts drawn without replacement (all of them when ``n >= len``)."""
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.permutation(len(self))[: min(n, len(self))])
        return self.subset(rows)

    def summary(self) -> dict:
        words = np.array([len(p.split()) for p in self.prompts])
        out = {
            "name": self.name,
            "source": self.source,
            "prompts": len(self),
            "generated": self.generated,
            "distinct": len(set(self.prompts)),
            "mean_words": round(float(words.mean()), 2),
            "median_words": float(np.median(words)),
        }
        for label, values in (("categories", self.categories), ("challenges", self.challenges)):
            if values is not None:
                uniq, counts = np.unique(np.array(values, dtype=object), return_counts=True)
                out[label] = {str(u): int(c) for u, c in sorted(zip(uniq, counts, strict=True), key=lambda x: -x[1])}
        return out


# ---------------------------------------------------------------------------------------------
# Files


def _find(header: list[str], *names: str) -> int | None:
    low = [h.strip().lower() for h in header]
    for n in names:
        if n in low:
            return low.index(n)
    return None


def _read_table(path: Path, text: str, delimiter: str, first_lineno: int) -> PromptSet:
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    rows = list(reader)
    header = rows[0] if rows else []
    col = _find(header, "prompt", "text", "caption")
    if col is None:
        if delimiter != "\t":
            raise PromptSetError(f"{path}:{first_lineno}: header has no 'prompt' column: {header[:6]}")
        # headerless TSV: first column is the prompt
        data, start, id_col, cat_col, ch_col, col = rows, first_lineno, None, None, None, 0
    else:
        data, start = rows[1:], first_lineno + 1
        id_col = _find(header, "prompt_id", "id")
        cat_col = _find(header, "category")
        ch_col = _find(header, "challenge")
    prompts, ids, cats, chs = [], [], [], []
    for lineno, rec in enumerate(data, start=start):
        if not rec or all(not c.strip() for c in rec):
            continue
        if col >= len(rec):
            raise PromptSetError(f"{path}:{lineno}: missing the prompt column ({len(rec)} fields)")
        prompt = rec[col].strip()
        if not prompt:
            raise PromptSetError(f"{path}:{lineno}: empty prompt")
        prompts.append(prompt)
        ids.append(rec[id_col].strip() if id_col is not None and id_col < len(rec) else f"{path.stem}-{len(ids)}")
        if cat_col is not None:
            cats.append(rec[cat_col].strip() if cat_col < len(rec) else "")
        if ch_col is not None:
            chs.append(rec[ch_col].strip() if ch_col < len(rec) else "")
    if not prompts:
        raise PromptSetError(f"{path}: no prompts")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise PromptSetError(f"{path}: duplicate prompt id {dup!r}")
    return PromptSet(
        prompts=tuple(prompts),
        ids=tuple(ids),
        name=path.stem,
        source=str(path),
        categories=tuple(cats) if cat_col is not None else None,
        challenges=tuple(chs) if ch_col is not None else None,
    )


def default_prompt_set() -> str:
    """``[traces] prompts`` (``ARGUSDIFF_TRACES__PROMPTS``), ``diffusiondb`` by default."""
    from traces.settings import traces_settings

    return traces_settings().prompts


def load_prompts(name_or_path: str | Path | None = None) -> PromptSet:
    """A prompt set: ``"diffusiondb"`` (packaged real prompts), ``"builtin"`` (generated), else a
    text/TSV/CSV file; ``None``: the configured default (:func:`default_prompt_set`)."""
    if name_or_path is None:
        name_or_path = default_prompt_set()
    if str(name_or_path) == "builtin":
        return builtin_prompts()
    if str(name_or_path) == "diffusiondb":
        return diffusiondb_prompts()
    path = Path(name_or_path)
    if not path.is_file():
        raise PromptSetError(f"prompt set {str(name_or_path)!r}: no such file (or use 'diffusiondb' or 'builtin')")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PromptSetError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    lines = text.splitlines()
    skip = 0
    while skip < len(lines) and lines[skip].startswith("#"):
        skip += 1
    body = "\n".join(lines[skip:])
    first = lines[skip] if skip < len(lines) else ""
    suffix = path.suffix.lower()
    if suffix == ".tsv" or "\t" in first:
        return _read_table(path, body, "\t", skip + 1)
    if suffix == ".csv":
        return _read_table(path, body, ",", skip + 1)
    prompts = [ln.strip() for ln in lines if ln.strip()]
    if not prompts:
        raise PromptSetError(f"{path}: no prompts")
    return PromptSet(
        prompts=tuple(prompts),
        ids=tuple(f"{path.stem}-{i}" for i in range(len(prompts))),
        name=path.stem,
        source=str(path),
    )


@lru_cache(maxsize=1)
def diffusiondb_prompts() -> PromptSet:
    """The packaged DiffusionDB sample: real user prompts in DiffusionDB's order (the one empty
    prompt of the 5,000 left out, as for any text file)."""
    ps = load_prompts(DIFFUSIONDB_FILE)
    return PromptSet(
        prompts=ps.prompts,
        ids=tuple(f"diffusiondb-{i:04d}" for i in range(len(ps))),
        name="diffusiondb",
        source=DIFFUSIONDB_SOURCE,
    )


def list_prompt_sets() -> list[dict[str, str]]:
    default = default_prompt_set()
    sets = [
        {
            "name": "diffusiondb",
            "prompts": str(len(diffusiondb_prompts())),
            "help": "real user prompts: DiffusionDB 2M's first 5,000 (CC0 1.0), with packaged MiniLM embeddings",
        },
        {
            "name": "builtin",
            "prompts": str(BUILTIN_SIZE),
            "help": "generated from templates (8 kinds of request), deterministic",
        },
    ]
    for s in sets:
        if s["name"] == default:
            s["help"] += "; the default ([traces] prompts)"
    return sets


# ---------------------------------------------------------------------------------------------
# The built-in generated set

_COLORS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple", "pink", "golden", "silver", "brown"]
_OBJECTS = [
    "apple", "teapot", "bicycle", "umbrella", "chair", "vase", "lamp", "guitar", "clock", "book", "cup", "hat",
    "balloon", "kite", "boat", "car", "shoe", "backpack", "candle", "bottle",
]  # fmt: skip
_ANIMALS = [
    "cat", "dog", "fox", "owl", "horse", "rabbit", "deer", "elephant", "panda", "penguin", "tiger", "turtle",
    "squirrel", "whale", "parrot", "lion", "koala", "frog",
]  # fmt: skip
_PLACES = [
    "a meadow", "the snow", "a forest", "the desert", "a beach", "a city street", "a kitchen", "a garden",
    "a library", "a field of flowers", "a mountain lake", "a quiet park",
]  # fmt: skip
_SURFACES = ["a wooden table", "the grass", "a white background", "a stone wall", "the sand", "a windowsill"]
_LANDSCAPES = [
    "mountains", "a valley", "rolling hills", "a coastline", "a lake", "a canyon", "a pine forest", "the ocean",
    "a river delta", "sand dunes", "a glacier", "a waterfall",
]  # fmt: skip
_TIMES = ["sunset", "sunrise", "night", "dawn", "midday", "dusk", "a foggy morning", "a stormy afternoon"]
_STYLES = [
    "an oil painting", "a watercolor painting", "a pencil sketch", "an impressionist painting", "a pastel drawing",
    "a minimalist poster", "a flat illustration", "an abstract painting", "a linocut print", "a charcoal drawing",
]  # fmt: skip
_ARTISTS = ["Claude Monet", "Vincent van Gogh", "Hokusai", "Paul Cezanne", "J. M. W. Turner", "Wassily Kandinsky"]
_PEOPLE = [
    "old fisherman", "young woman", "little girl", "elderly man", "jazz musician", "chef", "astronaut", "ballerina",
    "farmer", "scientist", "knight", "queen",
]  # fmt: skip
_FEATURES = [
    "freckles and green eyes", "a braided beard", "curly red hair", "a wrinkled smiling face", "round glasses",
    "a scar across the cheek", "hands folded in front", "tears in the eyes",
]  # fmt: skip
_PHOTO = ["studio lighting", "85mm lens", "soft window light", "shallow depth of field", "dramatic rim light"]
_WORDS = [
    "OPEN", "HELLO", "COFFEE", "NO PARKING", "WELCOME HOME", "SALE", "ARGUS", "FRESH BREAD", "EXIT", "DREAM BIG",
    "GOOD MORNING", "THE END", "LIBRARY", "STOP",
]  # fmt: skip
_TEXT_TEMPLATES = [
    'a neon sign that says "{w}"',
    'a storefront with the word "{w}" written above the door',
    'a hand-written note that reads "{w}" on a {c} paper',
    'a chalkboard with the text "{w}" in {c} chalk',
    'a t-shirt with the letters "{w}" printed on it',
    'a book cover titled "{w}", typography',
]
_NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve"]
_RELATIONS = ["to the left of", "to the right of", "on top of", "under", "behind", "in front of", "next to"]
_DETAIL_SUBJECTS = [
    "a steampunk airship over a victorian city", "a cyberpunk street market at night",
    "an ancient temple overgrown with vines", "a dragon coiled around a castle tower",
    "a futuristic cityscape with flying cars", "a mechanical owl made of brass gears",
    "a fantasy elf warrior in ornate armor", "an underwater palace with glowing coral", "a wizard's cluttered study",
    "a giant tree house village in the clouds",
]  # fmt: skip
_DETAIL_WORDS = [
    "intricate", "highly detailed", "ultra detailed", "8k", "sharp focus", "octane render", "unreal engine",
    "trending on artstation", "cinematic lighting", "hyperrealistic", "volumetric light", "concept art",
    "by greg rutkowski", "by artgerm", "photorealistic", "4k",
]  # fmt: skip


def _pick(rng: np.random.Generator, items: Sequence[str]) -> str:
    return items[int(rng.integers(len(items)))]


def _make(kind: str, rng: np.random.Generator) -> str:
    if kind == "simple":
        return _pick(
            rng,
            [
                f"a {_pick(rng, _COLORS)} {_pick(rng, _OBJECTS)} on {_pick(rng, _SURFACES)}",
                f"a {_pick(rng, _ANIMALS)} in {_pick(rng, _PLACES)}",
                f"a photo of a {_pick(rng, _ANIMALS)}",
                f"a {_pick(rng, _COLORS)} {_pick(rng, _OBJECTS)}",
            ],
        )
    if kind == "landscape":
        return f"{_pick(rng, _LANDSCAPES)} at {_pick(rng, _TIMES)}" + _pick(
            rng, ["", ", wide angle", ", calm and simple", ", soft colors"]
        )
    if kind == "style":
        subject = _pick(rng, [f"a {_pick(rng, _ANIMALS)}", _pick(rng, _LANDSCAPES), f"a {_pick(rng, _OBJECTS)}"])
        tail = _pick(rng, ["", f" in the style of {_pick(rng, _ARTISTS)}"])
        return f"{_pick(rng, _STYLES)} of {subject}{tail}"
    if kind == "portrait":
        lead = _pick(rng, ["a close-up portrait photo of", "a portrait of", "a candid photo of", "a headshot of"])
        return (
            f"{lead} a {_pick(rng, _PEOPLE)} with {_pick(rng, _FEATURES)}, {_pick(rng, _PHOTO)}"
            + _pick(rng, ["", ", detailed face", ", looking at the camera", ", holding a cup of tea"])
            + _pick(rng, ["", "", ", highly detailed, 8k, sharp focus", ", cinematic lighting, photorealistic"])
        )
    if kind == "text":
        return _pick(rng, _TEXT_TEMPLATES).format(w=_pick(rng, _WORDS), c=_pick(rng, _COLORS))
    if kind == "counting":
        n = _pick(rng, _NUMBERS)
        thing = _pick(rng, _OBJECTS + _ANIMALS)
        plural = thing + ("es" if thing.endswith(("ch", "sh", "x")) else "s")
        return _pick(
            rng,
            [
                f"exactly {n} {plural} in a row on {_pick(rng, _SURFACES)}",
                f"{n} {_pick(rng, _COLORS)} {plural} and one {_pick(rng, _COLORS)} {thing}",
                f"a group of {n} {plural}, each a different color",
            ],
        )
    if kind == "spatial":
        a, b = _pick(rng, _OBJECTS + _ANIMALS), _pick(rng, _OBJECTS + _ANIMALS)
        c = _pick(rng, _OBJECTS)
        return (
            f"a {_pick(rng, _COLORS)} {a} {_pick(rng, _RELATIONS)} a {_pick(rng, _COLORS)} {b}, "
            f"and a {c} {_pick(rng, _RELATIONS)} the {b}"
        )
    if kind == "detailed":
        k = int(rng.integers(3, 10))
        words = list(rng.choice(np.array(_DETAIL_WORDS, dtype=object), size=k, replace=False))
        setting = _pick(rng, ["", f", at {_pick(rng, _TIMES)}", f", {_pick(rng, _STYLES)}"])
        return f"{_pick(rng, _DETAIL_SUBJECTS)}{setting}, " + ", ".join(words)
    raise ValueError(kind)  # pragma: no cover


#: kinds of built-in prompt and their share of the set (roughly DiffusionDB-like: art-heavy)
BUILTIN_KINDS: dict[str, float] = {
    "simple": 0.10,
    "landscape": 0.07,
    "style": 0.11,
    "portrait": 0.18,
    "text": 0.06,
    "counting": 0.08,
    "spatial": 0.10,
    "detailed": 0.30,
}


@lru_cache(maxsize=4)
def builtin_prompts(n: int = BUILTIN_SIZE, seed: int = 20251123) -> PromptSet:
    """``n`` distinct template-generated prompts, the same for the same ``n`` and ``seed``."""
    rng = np.random.default_rng(seed)
    kinds = list(BUILTIN_KINDS)
    probs = np.array([BUILTIN_KINDS[k] for k in kinds])
    probs = probs / probs.sum()
    seen: set[str] = set()
    prompts: list[str] = []
    cats: list[str] = []
    attempts = 0
    while len(prompts) < n:
        attempts += 1
        if attempts > 50 * n:  # pragma: no cover - the templates allow far more than 6k prompts
            raise PromptSetError(f"cannot generate {n} distinct built-in prompts")
        kind = kinds[int(rng.choice(len(kinds), p=probs))]
        text = _make(kind, rng)
        if text in seen:
            continue
        seen.add(text)
        prompts.append(text)
        cats.append(kind)
    return PromptSet(
        prompts=tuple(prompts),
        ids=tuple(f"builtin-{i:05d}" for i in range(n)),
        name="builtin",
        source=f"generated from templates (seed {seed})",
        categories=tuple(cats),
        generated=True,
    )
