"""The `encore` wheel from Python: encode, run, quantize, errors, threads, pickling.

Needs the shared models (ENCORE_MODELS, else ../shared/models beside the repository): a missing
folder skips loudly, and fails under CI. ENCORE_BIN (set by .ci/run) is the release CLI, for the
bit-for-bit comparison with `encore embed`.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import encore

REPO = Path(__file__).resolve().parents[3]
MODELS = Path(os.environ.get("ENCORE_MODELS", REPO.parent / "shared" / "models"))
MINILM = MODELS / "minilm-l6"

if not (MODELS / "manifest.json").is_file():
    if os.environ.get("CI"):
        raise RuntimeError(f"shared models missing at {MODELS} (CI requires them)")
    print(f"SKIP test_encore.py: shared models missing at {MODELS} (set ENCORE_MODELS)", file=sys.stderr)
    pytest.skip(f"shared models missing at {MODELS}", allow_module_level=True)


def snippets(n: int, offset: int = 0) -> list[str]:
    lines = (MODELS / "data" / "movie_sentiment" / "test.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines[offset:offset + n]]


@pytest.fixture(scope="module")
def minilm() -> encore.Model:
    return encore.Model(MINILM / "model.onnx", tokenizer=MINILM / "tokenizer.json")


def test_encode_gives_unit_rows_that_do_not_depend_on_the_batch(minilm):
    texts = snippets(40)
    emb = minilm.encode(texts, batch_size=7)
    assert emb.shape == (40, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    alone = np.stack([minilm.encode(t) for t in texts[:5]])
    assert np.array_equal(alone.view(np.uint32), emb[:5].view(np.uint32))
    big = minilm.encode(texts, batch_size=64)
    assert np.array_equal(big.view(np.uint32), emb.view(np.uint32))
    raw = minilm.encode(texts[:3], normalize_embeddings=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


@pytest.mark.skipif(not os.environ.get("ENCORE_BIN"), reason="ENCORE_BIN (the release CLI) not set")
def test_encode_equals_encore_embed_bit_for_bit(minilm, tmp_path):
    texts = snippets(25, offset=100)
    src = tmp_path / "texts.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "emb.npy"
    subprocess.run([os.environ["ENCORE_BIN"], "embed", "--model", str(MINILM / "model.onnx"),
                    "--tokenizer", str(MINILM / "tokenizer.json"), "--input", str(src), "--output", str(out),
                    "--normalize", "--quiet"], check=True)
    reference = np.load(out)
    assert np.array_equal(minilm.encode(texts, batch_size=4).view(np.uint32), reference.view(np.uint32))


def test_run_matches_the_onnxruntime_reference(minilm):
    manifest = json.loads((MODELS / "manifest.json").read_text())
    entry = next(m for m in manifest["models"] if m["id"] == "minilm-l6")
    ref = MODELS / "reference" / "minilm-l6"
    batch = sorted({p.name.split(".")[0] for p in ref.glob("*.input_ids.npy")})[0]
    feeds = {n: np.load(ref / f"{batch}.{n}.npy") for n in ("input_ids", "attention_mask", "token_type_ids")}
    out = minilm.run(feeds)
    assert list(out) == minilm.output_names == [o["name"] for o in entry["outputs"]]
    expected = np.load(ref / f"{batch}.last_hidden_state.npy")
    real = feeds["attention_mask"].astype(bool)
    np.testing.assert_allclose(out["last_hidden_state"][real], expected[real], atol=1e-4)


def test_errors_are_encore_errors_with_the_runtime_message(minilm, tmp_path):
    with pytest.raises(encore.EncoreError, match="no_such_model.onnx"):
        encore.Model(tmp_path / "no_such_model.onnx")
    with pytest.raises(encore.EncoreError, match="empty"):
        minilm.encode(["fine", "  "])
    with pytest.raises(encore.EncoreError, match="missing input `attention_mask`"):
        minilm.run({"input_ids": np.array([[101, 102]]), "token_type_ids": np.array([[0, 0]])})
    with pytest.raises(encore.EncoreError, match="pooling"):
        minilm.encode("x", pooling="max")
    no_tokenizer = encore.Model(MINILM / "model.onnx")
    with pytest.raises(encore.EncoreError, match="tokenizer"):
        no_tokenizer.encode("x")


def test_threads_sharing_one_model_get_the_single_thread_rows(minilm):
    texts = snippets(16, offset=300)
    expected = minilm.encode(texts)
    results: list[np.ndarray | BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                results.append(minilm.encode(texts, batch_size=5))
        except BaseException as e:  # reported below, not lost in the thread
            results.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 12
    for r in results:
        assert isinstance(r, np.ndarray), r
        assert np.array_equal(r.view(np.uint32), expected.view(np.uint32))


def test_pickled_model_reopens_with_the_same_rows(minilm):
    again = pickle.loads(pickle.dumps(minilm))
    assert repr(again) == repr(minilm)
    texts = snippets(3)
    assert np.array_equal(again.encode(texts).view(np.uint32), minilm.encode(texts).view(np.uint32))


def test_quantize_writes_an_int8_model_close_to_fp32(minilm, tmp_path):
    out = tmp_path / "minilm.int8.encore"
    calibration = MODELS / "data" / "calibration" / "sentiment_train.jsonl"
    report = minilm.quantize(calibration, out, samples=96, held_back=32)
    assert out.is_file()
    assert len(report["quantized"]) >= 24, report
    assert report["held_back_cosine"] >= 0.99, report
    int8 = encore.Model(out, tokenizer=MINILM / "tokenizer.json")
    assert int8.precision == "int8" and minilm.precision == "float32"
    texts = snippets(20, offset=500)
    a, b = int8.encode(texts), minilm.encode(texts)
    assert float(np.mean(np.sum(a * b, axis=1))) >= 0.99
