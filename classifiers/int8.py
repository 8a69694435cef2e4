"""An int8 encoder with per-channel weight scales for the router's prompt pass, and the gate that
decides whether a classifier may use it.

Dynamic int8 quantisation of MiniLM's Linear layers with one scale per output channel keeps the
sentence embedding at cosine ~0.99 to float32 (one scale per tensor, torch's default, only ~0.94,
too far for the cache's neighbours). Two back ends, the same numbers within rounding:

* **ONNX Runtime** (``onnxruntime`` and ``onnx`` installed; the ``models`` extra): the encoder is
  exported to ONNX (from a copy: the exporter leaves its module altered), quantised with
  ``quantize_dynamic(per_channel=True)`` (int8 weights, uint8 activations), and run by an
  ``InferenceSession``; the file is cached under ``~/.cache/argusdiff/encoders`` by a hash of the
  weights, so a router restart does not export again;
* **torch** otherwise: ``quantize_dynamic`` with ``per_channel_dynamic_qconfig`` on a copy.

:func:`int8_gate` says whether a classifier may route with it: its held-out accuracy against the
labels within 1 point of float32, and its query embeddings finding the float32 embeddings' 5
nearest neighbours (cache recall@5) at least 0.95 of the time. ``[classifier] precision = "auto"``
uses int8 where a classifier's saved gate passed (:mod:`classifiers.level`).
"""

from __future__ import annotations

import copy
import hashlib
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GATE_ACCURACY_PP", "GATE_RECALL5", "Int8Encoder", "int8_gate", "recall_at_k"]

#: the gate: int8 held-out accuracy at most this many points below float32 ...
GATE_ACCURACY_PP = 1.0
#: ... and at least this share of the float32 embeddings' 5 nearest neighbours found
GATE_RECALL5 = 0.95
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_lock = threading.Lock()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("ARGUSDIFF_ENCODER_CACHE", Path(base) / "argusdiff" / "encoders"))


def _weights_hash(module: Any) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def ort_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class Int8Encoder:
    """``hidden(enc) -> last hidden states (torch float32)`` of an int8 per-channel copy of a
    transformers encoder (``model.base_model`` of a sequence classifier). ``backend``: ``onnx``,
    ``torch`` or ``auto`` (ONNX Runtime when installed)."""

    def __init__(self, encoder: Any, *, threads: int | None = None, backend: str = "auto") -> None:
        if backend == "auto":
            backend = "onnx" if ort_available() else "torch"
        self.backend = backend
        if backend == "onnx":
            self.session = self._onnx(encoder, threads)
            self.inputs = {i.name for i in self.session.get_inputs()}
        elif backend == "torch":
            import torch
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            with warnings.catch_warnings():  # torch.ao's deprecation notices
                warnings.simplefilter("ignore")
                self.module = quantize_dynamic(
                    copy.deepcopy(encoder).eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
                )
        else:
            raise ValueError(f"int8 backend must be onnx, torch or auto, got {backend!r}")

    @staticmethod
    def _onnx(encoder: Any, threads: int | None) -> Any:
        import onnxruntime as ort

        path = _cache_dir() / f"{_weights_hash(encoder)}.int8.onnx"
        with _lock:
            if not path.is_file():
                _export_int8(encoder, path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def hidden(self, enc: Mapping[str, Any]) -> Any:
        import torch

        if self.backend == "torch":
            return self.module(**{k: v for k, v in enc.items() if k in _INPUTS}).last_hidden_state
        feeds = {k: v.cpu().numpy().astype(np.int64) for k, v in enc.items() if k in self.inputs}
        if "token_type_ids" in self.inputs and "token_type_ids" not in feeds:
            feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
        return torch.from_numpy(self.session.run(None, feeds)[0])


def _export_int8(encoder: Any, path: Path) -> None:
    """Export a copy of ``encoder`` to ONNX and quantise it (int8 weights per output channel)."""
    import tempfile

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    class Hidden(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    model = Hidden(copy.deepcopy(encoder).float().cpu().eval())
    ids = torch.ones(2, 16, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded row, so the exported graph keeps the mask's path
    axes = {name: {0: "batch", 1: "tokens"} for name in (*_INPUTS, "last_hidden_state")}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp32 = Path(tmp) / "fp32.onnx"
        torch.onnx.export(model, (ids, mask, torch.zeros_like(ids)), str(fp32), input_names=list(_INPUTS),
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17,
                          dynamo=False)  # fmt: skip
        out = Path(tmp) / "int8.onnx"
        import logging

        quiet = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" notice
        try:
            quantize_dynamic(str(fp32), str(out), per_channel=True, weight_type=QuantType.QInt8)
        finally:
            logging.getLogger().setLevel(quiet)
        os.replace(out, path)  # atomic: a concurrent router never reads half a file


def recall_at_k(queries: np.ndarray, reference: np.ndarray, index: np.ndarray, k: int = 5) -> float:
    """Mean share of each reference query's ``k`` nearest rows of ``index`` (cosine) that the
    matching ``queries`` row also finds (rows L2-normalised here)."""

    def unit(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    idx = unit(index)
    k = min(k, len(idx))
    want = np.argsort(-(unit(reference) @ idx.T), axis=1)[:, :k]
    got = np.argsort(-(unit(queries) @ idx.T), axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(want, got, strict=True)]))


def int8_gate(classifier: Any, prompts: Sequence[str], labels: Sequence[int], index_prompts: Sequence[str]) -> dict:
    """The gate of ``classifier`` (a float32 :class:`classifiers.level.LevelClassifier`): its
    held-out accuracy on ``prompts`` against ``labels`` (level indices) in float32 and int8, and
    the cache recall@5 of int8 queries among the float32 embeddings of ``index_prompts``."""
    int8 = classifier.int8_copy()
    labels = np.asarray(labels)
    acc32 = float(np.mean(classifier.predict_index(list(prompts)) == labels))
    acc8 = float(np.mean(int8.predict_index(list(prompts)) == labels))
    index = classifier.pooled(list(index_prompts))
    recall = recall_at_k(int8.pooled(list(prompts)), classifier.pooled(list(prompts)), index)
    passed = (acc32 - acc8) * 100 <= GATE_ACCURACY_PP + 1e-9 and recall >= GATE_RECALL5
    return {
        "passed": bool(passed),
        "accuracy_float32": acc32,
        "accuracy_int8": acc8,
        "recall_at_5": recall,
        "backend": int8.int8.backend,
        "n": len(prompts),
        "index": len(index_prompts),
    }
