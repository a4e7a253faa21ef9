"""Ray Data and PySpark drive encore and give exactly the single-process embeddings.

Heavy (Ray and Spark start local clusters), so not part of the wheel tests CI runs: it runs when
`ray` / `pyspark` are importable, which `scripts/scale_out_check.sh` arranges in a venv of its
own; otherwise each test skips and says why.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import encore

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

REPO = HERE.parents[2]
MODELS = Path(os.environ.get("ENCORE_MODELS", REPO.parent / "shared" / "models"))
MINILM = MODELS / "minilm-l6"
if not (MODELS / "manifest.json").is_file():
    pytest.skip(f"shared models missing at {MODELS}", allow_module_level=True)


def calibration_snippets(n: int = 256) -> list[str]:
    lines = (MODELS / "data" / "calibration" / "sentiment_train.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines[:n]]


def single_process(texts: list[str]) -> np.ndarray:
    return encore.Model(MINILM / "model.onnx", tokenizer=MINILM / "tokenizer.json").encode(texts, batch_size=64)


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        msg = f"SKIP: `{module}` is not installed (scripts/scale_out_check.sh installs it)"
        print(msg, file=sys.stderr)
        pytest.skip(msg)


def test_ray_data_gives_the_single_process_embeddings():
    need("ray")
    import ray
    from ray_embed import embed_with_ray

    texts = calibration_snippets()
    # The workers import the example module (its class is pickled by reference) from here.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(EXAMPLES)}})
    try:
        got = embed_with_ray(texts, str(MINILM / "model.onnx"), str(MINILM / "tokenizer.json"), actors=2)
    finally:
        ray.shutdown()
    assert np.array_equal(got.view(np.uint32), single_process(texts).view(np.uint32))


def test_spark_map_in_pandas_gives_the_single_process_embeddings():
    need("pyspark")
    from pyspark.sql import SparkSession
    from spark_embed import embed_with_spark

    texts = calibration_snippets()
    # Spark's Python workers: this interpreter (the one with encore, pandas and pyarrow).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    spark = (SparkSession.builder.master("local[2]").appName("encore-test")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        got = embed_with_spark(texts, str(MINILM / "model.onnx"), str(MINILM / "tokenizer.json"), spark)
    finally:
        spark.stop()
    assert np.array_equal(got.view(np.uint32), single_process(texts).view(np.uint32))
