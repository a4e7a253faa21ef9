"""encore: INT8 inference of BERT-family encoders on x86 CPUs, from Python.

    import encore
    model = encore.Model("model.onnx", tokenizer="tokenizer.json")
    emb = model.encode(["A man is eating food.", "A man is riding a horse."])   # (2, 384) float32
    report = model.quantize(calibration_texts, "model.int8.encore")              # calibrated INT8
    fast = encore.Model("model.int8.encore", tokenizer="tokenizer.json")
    outputs = fast.run({"input_ids": ids, "attention_mask": mask})               # dict of arrays

`encode` follows sentence-transformers' names (`batch_size`, `normalize_embeddings`). Every call
that runs the model releases the GIL, so Python threads sharing one `Model` run in parallel, and
a text's embedding is the same bit for bit whatever else is in its batch. Errors raise
`encore.EncoreError` with the runtime's message.
"""

from __future__ import annotations

import io
import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from . import _native
from ._native import EncoreError

__all__ = ["Model", "EncoreError", "__version__"]
__version__ = _native.__version__


def _to_npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _from_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


class Model:
    """A compiled encoder: an ONNX file, or a `.encore` file written by `quantize`.

    `tokenizer` is a Hugging Face `tokenizer.json` (needed by `encode` and `quantize`);
    `threads` the worker threads of the session (default: every core); `max_length` the
    truncation of texts in tokens, special tokens included.
    """

    def __init__(self, path: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
                 threads: int | None = None, max_length: int = 256) -> None:
        self.path = os.fspath(path)
        self.tokenizer = None if tokenizer is None else os.fspath(tokenizer)
        self.threads = threads
        self.max_length = max_length
        self._native = _native.NativeModel(self.path, self.tokenizer, threads, max_length)

    def __reduce__(self):
        # Reopened from its files where it is unpickled (a Ray or Spark worker).
        return (Model, (self.path, self.tokenizer, self.threads, self.max_length))

    def __repr__(self) -> str:
        return f"encore.Model({self.path!r}, precision={self.precision!r})"

    @property
    def input_names(self) -> list[str]:
        return self._native.input_names

    @property
    def output_names(self) -> list[str]:
        return self._native.output_names

    @property
    def precision(self) -> str:
        """`int8` for a quantized model, `float32` otherwise."""
        return self._native.precision

    def encode(self, sentences: str | Sequence[str], batch_size: int = 32,
               normalize_embeddings: bool = True, pooling: str = "mean",
               convert_to_numpy: bool = True) -> np.ndarray:
        """Sentence embeddings, `(len(sentences), hidden)` float32 (one row for a single str).

        Mean pooling over the real tokens (or `pooling="cls"`), then L2 normalisation unless
        `normalize_embeddings=False`. Texts are run `batch_size` at a time, grouped by length.
        """
        if not convert_to_numpy:
            raise EncoreError("encode returns numpy arrays only (convert_to_numpy=True)")
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if not all(isinstance(t, str) for t in texts):
            raise EncoreError("encode takes a str or a list of str")
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        out = _from_npy(self._native.encode(texts, batch_size, normalize_embeddings, pooling))
        return out[0] if single else out

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs the model on named arrays (int64 ids and masks, float32, ...); named outputs."""
        feeds = [(name, _to_npy(np.asarray(value))) for name, value in inputs.items()]
        return {name: _from_npy(data) for name, data in self._native.run(feeds)}

    def quantize(self, calibration: str | os.PathLike | Iterable[str], out: str | os.PathLike,
                 samples: int = 512, alpha: float = 0.5, activations: str = "dynamic",
                 keep_fp32: Sequence[str] = (), min_cosine: float | None = None,
                 held_back: int = 64, batch_size: int = 16) -> dict:
        """Calibrates on text, SmoothQuants, quantizes to INT8 and writes one `.encore` file.

        `calibration` is a list of texts, or a file: JSONL with a `text` field, or one text per
        line. The first `samples` texts are used, the last `held_back` of them only to measure
        the INT8-to-FP32 cosine (and, with `min_cosine`, to keep the worst layers in FP32 until
        it is reached). Returns the report: quantized layers, layers kept in FP32 and why, the
        held-back cosine.
        """
        if isinstance(calibration, (str, os.PathLike)):
            texts = _read_texts(os.fspath(calibration))
        else:
            texts = [str(t) for t in calibration]
        texts = texts[:samples]
        return self._native.quantize(texts, os.fspath(out), alpha, activations, list(keep_fp32),
                                     min_cosine, held_back, batch_size)


def _read_texts(path: str) -> list[str]:
    import json

    texts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.endswith((".jsonl", ".ndjson")):
                try:
                    texts.append(json.loads(line)["text"])
                except (ValueError, KeyError, TypeError) as e:
                    raise EncoreError(f"{path}: line {number}: no `text` field ({e})") from None
            else:
                texts.append(line.rstrip("\n"))
    return texts
