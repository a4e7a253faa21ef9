#!/usr/bin/env python3
"""Compare encore's int8 GEMM kernels with onnxruntime on the BERT GEMM shapes.

Usage (from the repository root):

    python3 scripts/gemm_vs_ort.py                    # runs the Rust bench, then ORT
    python3 scripts/gemm_vs_ort.py --rust-json F.json # reuse a JSON written by the Rust bench
    python3 scripts/gemm_vs_ort.py --quick            # M in {128, 1024} only
    python3 scripts/gemm_vs_ort.py --rounds 3         # more alternations on a noisy machine

What it does:
1. Creates a venv in .venv-gemm-ort (once) and pip-installs onnxruntime, onnx and numpy into it,
   then re-runs itself inside the venv.
2. Unless --rust-json is given, runs, for each M,
   `cargo bench -p codegen --bench gemm -- --json target-kernels/gemm_m<M>.json --int8-only --m M`
   and then times ORT on the same shapes; this alternation is repeated --rounds times (default 2)
   and the best figure of each side is kept, so that load from other processes on a shared
   machine does not favour one side.
3. Builds two one-node models per shape with onnx.helper:
   * MatMulInteger: A u8 [M,K] (zero point 128) x B s8 [K,N] initializer -> i32 [M,N]
     (compared with encore's raw i32 kernel, the `picked` int8 row);
   * QDQ MatMul: DequantizeLinear(A u8) x DequantizeLinear(W s8, per-channel scales) ->
     QuantizeLinear -> u8 (ORT fuses this into QLinearMatMul; compared with encore's fused
     dequant->requant row, `<kernel>+rq`).
4. Times each with intra_op_num_threads = 1 and 2, best of >= 3 runs and >= 0.15 s, the same
   rule as the Rust side, and prints GOPS and the encore / ORT ratios.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-gemm-ort")
SHAPES_NK = [(768, 768), (2304, 768), (3072, 768), (768, 3072)]


def ensure_venv():
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "onnxruntime", "onnx", "numpy"])
    os.execv(py, [py] + sys.argv)


def best_time(fn, budget=0.15):
    fn()
    best = float("inf")
    runs = 0
    start = time.perf_counter()
    while runs < 3 or time.perf_counter() - start < budget:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        runs += 1
    return best


def matmul_integer_model(m, n, k, rng):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    b = rng.integers(-128, 128, size=(k, n), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B", "a_zp"], ["Y"])],
        "mmi",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [m, n])],
        [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.array(128, dtype=np.uint8), "a_zp")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def qdq_matmul_model(m, n, k, rng):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(np.array(0.02, dtype=np.float32), "a_s"),
        numpy_helper.from_array(np.array(128, dtype=np.uint8), "a_zp"),
        numpy_helper.from_array(np.full((n,), 0.01, dtype=np.float32), "w_s"),
        numpy_helper.from_array(np.zeros((n,), dtype=np.int8), "w_zp"),
        numpy_helper.from_array(np.array(2.0, dtype=np.float32), "y_s"),
        numpy_helper.from_array(np.array(128, dtype=np.uint8), "y_zp"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["A", "a_s", "a_zp"], ["Af"]),
        helper.make_node("DequantizeLinear", ["W", "w_s", "w_zp"], ["Wf"], axis=1),
        helper.make_node("MatMul", ["Af", "Wf"], ["Yf"]),
        helper.make_node("QuantizeLinear", ["Yf", "y_s", "y_zp"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.UINT8, [m, n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def time_ort(model, m, k, threads, rng):
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    return best_time(lambda: sess.run(None, {"A": a}))


def run_rust(m, path, quick):
    cmd = ["cargo", "bench", "-p", "codegen", "--bench", "gemm", "--", "--json", path, "--int8-only", "--m", str(m)]
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(ROOT, "target-kernels"))
    subprocess.check_call(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)["results"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rust-json", help="JSON written by `cargo bench -p codegen --bench gemm -- --json F` (skips running it)")
    ap.add_argument("--quick", action="store_true", help="M in {128, 1024} only")
    ap.add_argument("--rounds", type=int, default=2, help="alternate encore and ORT this many times, keep the best of each")
    args = ap.parse_args()
    ensure_venv()
    import numpy as np
    import onnxruntime as ort

    ms = [128, 1024] if args.quick else [128, 1024, 4096]
    fixed = None
    if args.rust_json:
        with open(args.rust_json) as f:
            fixed = json.load(f)["results"]
        ms = sorted({r["m"] for r in fixed})
    rng = np.random.default_rng(0)
    best_rust = {}  # (m, n, k, t, "i32"|"rq") -> GOPS
    best_ort = {}  # (m, n, k, t, "mmi"|"qdq") -> GOPS
    models = {}
    # Rust and ORT alternate per M and round, so a busy spell on a shared machine hits both.
    for rnd in range(args.rounds):
        for m in ms:
            rows = fixed if fixed is not None else run_rust(m, os.path.join(ROOT, "target-kernels", f"gemm_m{m}.json"), args.quick)
            for r in rows:
                if r["dtype"] != "int8" or r["m"] != m:
                    continue
                kind = "rq" if r["kernel"].endswith("+rq") else ("i32" if r["picked"] else None)
                if kind:
                    key = (m, r["n"], r["k"], r["threads"], kind)
                    best_rust[key] = max(best_rust.get(key, 0.0), r["gops"])
            for n, k in SHAPES_NK:
                if (m, n, k) not in models:
                    models[(m, n, k)] = (matmul_integer_model(m, n, k, rng), qdq_matmul_model(m, n, k, rng))
                mmi_model, qdq_model = models[(m, n, k)]
                ops = 2.0 * m * n * k
                for t in (1, 2):
                    for kind, model in (("mmi", mmi_model), ("qdq", qdq_model)):
                        g = ops / time_ort(model, m, k, t, rng) / 1e9
                        key = (m, n, k, t, kind)
                        best_ort[key] = max(best_ort.get(key, 0.0), g)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    print(f"onnxruntime {ort.__version__}; best of {args.rounds} alternating rounds")
    print(f"{'M':>5} {'N':>5} {'K':>5} {'thr':>3} | {'ORT MMI':>8} {'encore i32':>10} {'ratio':>6} | {'ORT QDQ':>8} {'encore rq':>9} {'ratio':>6}")
    ratios = []
    for m in ms:
        for n, k in SHAPES_NK:
            for t in (1, 2):
                ours = best_rust.get((m, n, k, t, "i32"))
                ours_rq = best_rust.get((m, n, k, t, "rq"))
                mmi = best_ort[(m, n, k, t, "mmi")]
                qdq = best_ort[(m, n, k, t, "qdq")]
                if ours is None or ours_rq is None:
                    continue
                r1, r2 = ours / mmi, ours_rq / qdq
                ratios.append((t, r1, r2))
                print(f"{m:>5} {n:>5} {k:>5} {t:>3} | {mmi:>8.1f} {ours:>10.1f} {r1:>5.2f}x | {qdq:>8.1f} {ours_rq:>9.1f} {r2:>5.2f}x")
    for t in (1, 2):
        v = [(a, b) for (tt, a, b) in ratios if tt == t]
        if v:
            g1 = float(np.exp(np.mean(np.log([a for a, _ in v]))))
            g2 = float(np.exp(np.mean(np.log([b for _, b in v]))))
            print(f"geomean encore/ORT, {t} thread(s): MatMulInteger {g1:.2f}x, QDQ {g2:.2f}x")


if __name__ == "__main__":
    main()
