"""What releasing the GIL buys: texts/s of one Python thread encoding 512 snippets with a
one-thread model, against two Python threads sharing that model, each encoding half.

    python thread_scaling.py [MODELS_DIR]
"""
import sys
import json, threading, time, encore, numpy as np
MODELS = sys.argv[1] if len(sys.argv) > 1 else "../shared/models"
M = f"{MODELS}/minilm-l6"
texts = [json.loads(l)["text"] for l in open(f"{MODELS}/data/movie_sentiment/test.jsonl")][:512]
m = encore.Model(f"{M}/model.onnx", tokenizer=f"{M}/tokenizer.json", threads=1)
m.encode(texts[:64])
def one(ts): m.encode(ts, batch_size=32)
for rep in range(3):
    t0 = time.perf_counter(); one(texts); t1 = time.perf_counter() - t0
    halves = [texts[0::2], texts[1::2]]
    th = [threading.Thread(target=one, args=(h,)) for h in halves]
    t0 = time.perf_counter(); [t.start() for t in th]; [t.join() for t in th]; t2 = time.perf_counter() - t0
    print(f"rep {rep}: 1 Python thread {len(texts)/t1:.1f} texts/s, 2 Python threads sharing the model {len(texts)/t2:.1f} texts/s, speedup {t1/t2:.2f}x")
