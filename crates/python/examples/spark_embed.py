"""Embeds texts with encore inside PySpark: `mapInPandas` opens one `encore.Model` per Python
worker and embeds each Arrow batch; rows keep their ids.

    python spark_embed.py MODEL TOKENIZER TEXTS.jsonl OUT.npy [--master local[2]]

On a cluster, submit the same script with `spark-submit --master yarn|k8s://...` (the wheel
installed on the executors, e.g. through a packed virtualenv in `--archives`, and the model on
shared storage); each executor core runs one Python worker with a one-thread model.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import encore


def embed_with_spark(texts: list[str], model: str, tokenizer: str, spark) -> np.ndarray:
    import pandas as pd

    df = spark.createDataFrame(list(enumerate(texts)), "id long, text string")

    def embed(batches):
        m = encore.Model(model, tokenizer=tokenizer, threads=1)
        for pdf in batches:
            emb = m.encode(pdf["text"].tolist(), batch_size=64)
            yield pd.DataFrame({"id": pdf["id"], "embedding": list(emb)})

    rows = df.mapInPandas(embed, schema="id long, embedding array<float>").collect()
    rows.sort(key=lambda r: r["id"])
    return np.stack([np.asarray(r["embedding"], dtype=np.float32) for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("tokenizer")
    p.add_argument("texts", help="JSONL with a `text` field")
    p.add_argument("out", help=".npy of the embeddings, rows in input order")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args()
    from pyspark.sql import SparkSession

    texts = [json.loads(line)["text"] for line in open(args.texts, encoding="utf-8") if line.strip()]
    spark = SparkSession.builder.master(args.master).appName("encore-embed").getOrCreate()
    try:
        import time

        t0 = time.perf_counter()
        emb = embed_with_spark(texts, args.model, args.tokenizer, spark)
        took = time.perf_counter() - t0
        np.save(args.out, emb)
        print(f"embedded {len(texts)} texts in {took:.1f} s ({len(texts) / took:.1f} texts/s) on {args.master}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
