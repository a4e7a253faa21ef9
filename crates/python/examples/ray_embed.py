"""Embeds texts with encore inside Ray Data: each actor holds one `encore.Model` and embeds the
batches Ray hands it; rows come back with their ids, so the order of the data set is kept.

    python ray_embed.py MODEL TOKENIZER TEXTS.jsonl OUT.npy [--actors 2]

Locally `ray.init()` starts a Ray instance on this machine. On a cluster, the same code runs
unchanged under `ray job submit -- python ray_embed.py ...` (or with `ray.init("ray://head:10001")`):
the wheel must be installed on every node (a `runtime_env={"pip": ["encore-...whl"]}` does it) and
the model and tokenizer paths must exist there (shared storage). Each actor uses `--threads`
cores; `concurrency` actors run at once, so size `concurrency x threads` to the cores Ray has.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import encore


class EncoreEmbedder:
    """A Ray Data callable class: one model per actor, loaded once."""

    def __init__(self, model: str, tokenizer: str, threads: int = 1) -> None:
        self.model = encore.Model(model, tokenizer=tokenizer, threads=threads)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        emb = self.model.encode([str(t) for t in batch["text"]], batch_size=64)
        return {"id": batch["id"], "embedding": emb}


def embed_with_ray(texts: list[str], model: str, tokenizer: str, actors: int = 2, threads: int = 1) -> np.ndarray:
    import ray

    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    out = ds.map_batches(
        EncoreEmbedder,
        fn_constructor_kwargs={"model": model, "tokenizer": tokenizer, "threads": threads},
        concurrency=actors,
        batch_size=64,
        num_cpus=threads,
    )
    rows = sorted(out.take_all(), key=lambda r: r["id"])
    return np.stack([np.asarray(r["embedding"], dtype=np.float32) for r in rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("tokenizer")
    p.add_argument("texts", help="JSONL with a `text` field")
    p.add_argument("out", help=".npy of the embeddings, rows in input order")
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import ray

    texts = [json.loads(line)["text"] for line in open(args.texts, encoding="utf-8") if line.strip()]
    import time

    ray.init()
    t0 = time.perf_counter()
    emb = embed_with_ray(texts, args.model, args.tokenizer, args.actors, args.threads)
    took = time.perf_counter() - t0
    np.save(args.out, emb)
    print(f"embedded {len(texts)} texts in {took:.1f} s ({len(texts) / took:.1f} texts/s) with {args.actors} actors "
          f"of {args.threads} thread(s), actor start-up included")


if __name__ == "__main__":
    main()
