"""The peer of `encore serve` in scripts/load_test.py: a FastAPI + onnxruntime embedding server
as people write one, with text-embeddings-inference's `POST /embed` contract (`inputs`,
`normalize`) and `GET /health`.

Each request runs as one batch (padded to its longest text) in FastAPI's thread pool; onnxruntime
releases the GIL while it runs, so requests overlap. Mean pooling over the attention mask and L2
normalisation, as sentence-transformers does. The response is written with `JSONResponse`
directly (FastAPI's `jsonable_encoder` walk over every float would make the peer look slower
than it needs to be).

Configured by environment variables (uvicorn imports this module):
  PEER_MODEL       the ONNX model
  PEER_TOKENIZER   its tokenizer.json
  PEER_MAX_LENGTH  truncation in tokens (default 256)
  PEER_THREADS     onnxruntime intra-op threads (default 2)

Run: uvicorn --app-dir scripts peer_server:app --host 127.0.0.1 --port 8081 --workers 1
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from tokenizers import Tokenizer

MODEL = os.environ["PEER_MODEL"]
TOKENIZER = os.environ["PEER_TOKENIZER"]
MAX_LENGTH = int(os.environ.get("PEER_MAX_LENGTH", "256"))
THREADS = int(os.environ.get("PEER_THREADS", "2"))

options = ort.SessionOptions()
options.intra_op_num_threads = THREADS
options.inter_op_num_threads = 1
session = ort.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])
input_names = {i.name for i in session.get_inputs()}

tokenizer = Tokenizer.from_file(TOKENIZER)
tokenizer.enable_truncation(MAX_LENGTH)
pad_id = tokenizer.token_to_id("[PAD]") or 0
tokenizer.enable_padding(pad_id=pad_id, pad_token="[PAD]")

app = FastAPI()


class EmbedRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": "Validation"}, status_code=status)


@app.post("/embed")
def embed(req: EmbedRequest) -> JSONResponse:
    texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
    if not texts or any(not t.strip() for t in texts):
        return error(422, "`inputs` cannot be empty")
    encodings = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v for k, v in feeds.items() if k in input_names}
    hidden = session.run(None, feeds)[0]
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    if req.normalize:
        pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return JSONResponse(pooled.tolist())


@app.get("/health")
def health() -> dict:
    return {"status": "ok"}
