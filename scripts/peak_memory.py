#!/usr/bin/env python3
"""Peak resident memory of BERT-base INT8 in encore, onnxruntime and OpenVINO, each engine in its
own process running the same batch.

Usage (in the venv of bench_int8.py, which has onnxruntime, openvino and nncf):

    .venv-int8-bench/bin/python scripts/peak_memory.py --workdir DIR [--batch 8] [--seq 128] [--threads 2]

DIR must hold what `scripts/bench_int8.py --workdir DIR` leaves there: `encore`, `bert-base.onnx`,
`bert-base.int8.encore`, `bert-base.int8-static.encore`, `bert-base.ort-int8-dynamic.onnx`. The
OpenVINO model is quantized here with NNCF as bench_int8.py does (TRANSFORMER, 64 random samples)
and saved as `bert-base.ov-int8.xml` first (in a process of its own, not measured).

Each engine runs in a fresh process: load, compile, 3 runs of a `batch x seq` batch; its peak
resident set (GNU time's `%M`) is reported, beside the same process with only the
library imported (the interpreter and the library's own share, which a user pays as well).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

RUN_ORT = """
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = {threads}; so.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
names = [i.name for i in s.get_inputs()]
ids = np.random.default_rng(0).integers(5, 30000, size=({batch}, {seq}), dtype=np.int64)
feeds = {{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}}
for _ in range(3):
    s.run(None, {{k: v for k, v in feeds.items() if k in names}})
"""

RUN_OV = """
import sys, numpy as np, openvino as ov
core = ov.Core()
m = core.read_model(sys.argv[1])
names = [p.get_any_name() for p in m.inputs]
m.reshape({{n: [{batch}, {seq}] for n in names}})
c = core.compile_model(m, "CPU", {{"INFERENCE_NUM_THREADS": {threads}, "PERFORMANCE_HINT": "LATENCY",
                                   "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}})
r = c.create_infer_request()
ids = np.random.default_rng(0).integers(5, 30000, size=({batch}, {seq}), dtype=np.int64)
feeds = {{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}}
for _ in range(3):
    r.infer({{k: v for k, v in feeds.items() if k in names}})
"""

QUANTIZE_OV = """
import sys, contextlib, numpy as np, openvino as ov, nncf
core = ov.Core()
m = core.read_model(sys.argv[1])
names = [p.get_any_name() for p in m.inputs]
rng = np.random.default_rng(0)
def sample():
    ids = rng.integers(5, 30000, size=(1, {seq}), dtype=np.int64)
    f = {{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}}
    return {{k: v for k, v in f.items() if k in names}}
with contextlib.redirect_stdout(sys.stderr):
    q = nncf.quantize(m, nncf.Dataset([sample() for _ in range(64)]), model_type=nncf.ModelType.TRANSFORMER,
                      target_device=nncf.TargetDevice.CPU, subset_size=64)
ov.save_model(q, sys.argv[2])
"""


def peak_kib(cmd: list[str]) -> int:
    """Runs `cmd` under GNU time and returns its peak resident set in KiB (`%M`)."""
    r = subprocess.run(["/usr/bin/time", "-f", "PEAK_KIB %M", *cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"failed:\n{r.stderr[-2000:]}")
    lines = [x for x in r.stderr.splitlines() if x.startswith("PEAK_KIB ")]
    if not lines:
        raise RuntimeError(f"GNU time printed no peak:\n{r.stderr[-2000:]}")
    return int(lines[-1].split()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    d = Path(a.workdir)
    ov_xml = d / "bert-base.ov-int8.xml"
    if not ov_xml.exists():
        print(f"quantizing {d / 'bert-base.onnx'} with NNCF into {ov_xml} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-c", QUANTIZE_OV.format(seq=a.seq), str(d / "bert-base.onnx"),
                        str(ov_xml)], check=True, stdout=subprocess.DEVNULL)
    fmt = dict(batch=a.batch, seq=a.seq, threads=a.threads)
    py = sys.executable
    encore = str(d / "encore")
    bench = ["bench", "--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads),
             "--warmup", "0", "--seconds", "0", "--min-runs", "3"]
    cases = [
        ("encore INT8 dynamic (.encore)", [encore, *bench, "--model", str(d / "bert-base.int8.encore")]),
        ("encore INT8 static (.encore)", [encore, *bench, "--model", str(d / "bert-base.int8-static.encore")]),
        ("python + onnxruntime imported", [py, "-c", "import numpy, onnxruntime"]),
        ("onnxruntime INT8 dynamic", [py, "-c", RUN_ORT.format(**fmt), str(d / "bert-base.ort-int8-dynamic.onnx")]),
        ("python + openvino imported", [py, "-c", "import numpy, openvino"]),
        ("OpenVINO INT8 (NNCF)", [py, "-c", RUN_OV.format(**fmt), str(ov_xml)]),
    ]
    results = []
    for name, cmd in cases:
        try:
            kib = peak_kib(cmd)
        except RuntimeError as e:
            print(f"{name}: {e}", file=sys.stderr)
            results.append((name, None))
            continue
        results.append((name, kib))
        print(f"{name:<34} {kib / 1024:8.1f} MiB", flush=True)
    return 0 if all(k is not None for _, k in results) else 1


if __name__ == "__main__":
    sys.exit(main())
