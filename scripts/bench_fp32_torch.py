#!/usr/bin/env python3
"""FP32 throughput of encore beside PyTorch eager (oneMKL / oneDNN) on the same BERT-base weights.

Usage (from anywhere; paths are relative to the repository root):

    python3 scripts/bench_fp32_torch.py                       # bert-base, batch 1/8/32, seq 128, 2 threads
    python3 scripts/bench_fp32_torch.py --batches 8,32 --rounds 2 --seconds 4 --out fp32-torch.json
    python3 scripts/bench_fp32_torch.py --model m.onnx        # an existing BERT ONNX, no build-model

What it does:

1. Creates a virtualenv (default .venv-torch-bench in the repository root), installs
   scripts/requirements-torch-bench.txt (pinned torch, transformers, onnx, onnxruntime, numpy:
   about 5.5 GB, most of it the CUDA libraries PyPI's torch will not import without) and re-runs
   itself inside it. `--no-venv` uses the running Python as it is.
2. Builds the encore CLI (or takes `--encore-bin`) and writes the model with
   `encore build-model --preset bert-base`.
3. Builds the PyTorch twin of the ONNX file: a `transformers.BertModel` whose configuration is read
   off the initializers (hidden size, layers, FFN width, vocabulary, positions, token types; 64-wide
   heads) and whose every parameter is loaded from them (a torch.onnx export names the biases
   after their modules and the weights `onnx::MatMul_N`, each just before its bias: the weight is
   that MatMul's B, transposed). Any parameter left unloaded or initializer left unused is an
   error. Then checks the twin against onnxruntime on two sequences, one of them padded: the
   largest difference of `last_hidden_state` and `pooler_output` must be under `--tolerance`
   (default 1e-3), else the run stops: a slower or faster model that computes something else
   proves nothing.
4. For each round and each batch size, interleaved: `encore bench --model M --json` (FP32), then
   PyTorch eager in this process (`torch.set_num_threads(T)`, `torch.inference_mode()`, the
   model in eval mode, transformers' default attention, SDPA) with warm-up runs and then timed
   runs for at least `--seconds` and `--min-runs`, the protocol of `encore bench`, on random ids
   in [5, vocab), a full mask and token type 0.
5. Prints the CPU model and a table (median over rounds of each side's seq/s and p50 latency, and
   encore / PyTorch), and with `--out FILE` writes every measurement as JSON.

Exit status: 0 when every measurement ran, 1 on any failure (the message says which step),
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import benchlib
from benchlib import REPO, BenchError, load_1m, log, run_cmd, tail

benchlib.PROG = "bench_fp32_torch"
REQUIREMENTS = REPO / "scripts" / "requirements-torch-bench.txt"
IN_VENV_MARKER = "ENCORE_TORCH_BENCH_IN_VENV"
REQUIRED_KEYS = ("throughput_seq_per_s", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99")


def bench_encore(args: argparse.Namespace, encore: Path, model: Path, batch: int) -> dict:
    cmd = [
        str(encore), "bench", "--model", str(model), "--batch", str(batch), "--seq", str(args.seq),
        "--threads", str(args.threads), "--seconds", str(args.seconds), "--min-runs", str(args.min_runs),
        "--warmup", str(args.warmup), "--json",
    ]
    out = run_cmd(cmd, f"encore bench batch {batch}", timeout=args.timeout)
    for line in reversed(out.strip().splitlines()):
        if line.strip().startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchError(f"encore bench printed invalid JSON: {e}\n{tail(out)}") from e
            missing = [k for k in REQUIRED_KEYS if k not in result]
            if missing:
                raise BenchError(f"encore bench JSON lacks {missing}: {line}")
            return result
    raise BenchError(f"encore bench printed no JSON object:\n{tail(out)}")


def torch_twin(model_path: Path):
    """The `transformers.BertModel` holding the ONNX file's weights, and its configuration."""
    import onnx
    import torch
    from onnx import numpy_helper
    from transformers import BertConfig, BertModel

    graph = onnx.load(str(model_path)).graph
    inits = [(i.name, numpy_helper.to_array(i)) for i in graph.initializer]
    by_name = dict(inits)
    prefix = "model." if any(n.startswith("model.") for n, _ in inits) else ""

    def need(name: str):
        if prefix + name not in by_name:
            raise BenchError(f"{model_path.name} has no initializer {prefix + name}: not a BERT export this script maps")
        return by_name[prefix + name]

    words, hidden = need("embeddings.word_embeddings.weight").shape
    layers = 0
    while prefix + f"encoder.layer.{layers}.intermediate.dense.bias" in by_name:
        layers += 1
    if layers == 0 or hidden % 64:
        raise BenchError(f"{model_path.name}: {layers} encoder layers of width {hidden}: not a BERT this script maps")
    config = BertConfig(
        vocab_size=words,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        intermediate_size=need("encoder.layer.0.intermediate.dense.bias").shape[0],
        max_position_embeddings=need("embeddings.position_embeddings.weight").shape[0],
        type_vocab_size=need("embeddings.token_type_embeddings.weight").shape[0],
        hidden_act="gelu",
        layer_norm_eps=1e-12,
    )
    twin = BertModel(config).eval()
    wanted = twin.state_dict()
    state, pending = {}, None
    for name, arr in inits:
        key = name[len(prefix):] if name.startswith(prefix) else None
        if key in wanted:
            if pending is not None:
                if not key.endswith(".bias"):
                    raise BenchError(f"weight {pending[0]} is followed by {name}, not by its bias")
                state[key[: -len("bias")] + "weight"] = torch.from_numpy(pending[1].T.copy())
                pending = None
            state[key] = torch.from_numpy(arr.copy())
        elif name.startswith("onnx::MatMul") and pending is None and arr.ndim == 2:
            pending = (name, arr)
        elif arr.size > 1:
            raise BenchError(f"initializer {name} {list(arr.shape)} maps to no BERT parameter")
    missing = sorted(set(wanted) - set(state) - {"embeddings.position_ids", "embeddings.token_type_ids"})
    unused = sorted(set(state) - set(wanted))
    if missing or unused or pending is not None:
        raise BenchError(f"weights do not map: missing {missing[:4]}, unused {unused[:4]}, dangling {pending and pending[0]}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(wanted[key].shape):
            raise BenchError(f"{key}: ONNX gives {list(value.shape)}, BertModel wants {list(wanted[key].shape)}")
    twin.load_state_dict(state, strict=False)
    return twin, config


def check_twin(args: argparse.Namespace, twin, model_path: Path, vocab: int) -> float:
    """The largest |PyTorch − onnxruntime| over both outputs on two sequences, one padded."""
    import numpy as np
    import onnxruntime as ort
    import torch

    rng = np.random.default_rng(7)
    ids = rng.integers(5, vocab, size=(2, 32), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[1, 20:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    ref = dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in wanted})))
    with torch.inference_mode():
        out = twin(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    diff = 0.0
    for name, ours in (("last_hidden_state", out.last_hidden_state), ("pooler_output", out.pooler_output)):
        if name not in ref:
            raise BenchError(f"onnxruntime gives no {name} (outputs {names})")
        a, b = ours.numpy(), ref[name]
        # Padded query rows are defined by neither model's users; only real tokens are compared.
        if name == "last_hidden_state":
            a, b = a[mask.astype(bool)], b[mask.astype(bool)]
        diff = max(diff, float(np.max(np.abs(a - b))))
    if not diff <= args.tolerance:
        raise BenchError(f"the PyTorch twin differs from onnxruntime by {diff:.3g} (> --tolerance {args.tolerance})")
    return diff


def bench_torch(args: argparse.Namespace, twin, vocab: int, batch: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(5, vocab, (batch, args.seq), generator=gen)
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    lat = []
    with torch.inference_mode():
        for _ in range(args.warmup):
            twin(**feeds)
        start = time.perf_counter()
        while len(lat) < max(args.min_runs, 1) or time.perf_counter() - start < args.seconds:
            t = time.perf_counter()
            twin(**feeds)
            lat.append((time.perf_counter() - t) * 1e3)
            if time.perf_counter() - start > args.timeout:
                raise BenchError(f"PyTorch batch {batch}: over --timeout {args.timeout} s")
    ordered = sorted(lat)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {
        "runs": len(lat),
        "throughput_seq_per_s": len(lat) * batch / (sum(lat) / 1e3),
        "latency_ms_p50": pct(50),
        "latency_ms_p90": pct(90),
        "latency_ms_p99": pct(99),
    }


def summarize(rows: dict[int, dict[str, list[dict]]]) -> list[dict]:
    out = []
    for batch, sides in rows.items():
        med = {s: statistics.median(r["throughput_seq_per_s"] for r in v) for s, v in sides.items()}
        p50 = {s: statistics.median(r["latency_ms_p50"] for r in v) for s, v in sides.items()}
        out.append({
            "batch": batch,
            "encore_seq_per_s": med["encore"],
            "torch_seq_per_s": med["torch"],
            "ratio_encore_over_torch": med["encore"] / med["torch"] if med["torch"] > 0 else float("nan"),
            "encore_p50_ms": p50["encore"],
            "torch_p50_ms": p50["torch"],
            "rounds": len(sides["encore"]),
        })
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="bert-base", help="encore build-model preset (default bert-base; BERT presets only)")
    p.add_argument("--model", help="use this BERT ONNX file instead of building one")
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes (default 1,8,32)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per batch (default 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="minimum timed seconds per measurement")
    p.add_argument("--min-runs", type=int, default=5, help="minimum timed runs per measurement")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest |PyTorch − onnxruntime| allowed when checking the twin (default 1e-3)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per command or measurement")
    p.add_argument("--out", help="write all results as JSON here")
    p.add_argument("--workdir", help="where the built model goes (default: a temporary folder, removed after)")
    p.add_argument("--encore-bin", help="use this encore executable instead of building one")
    p.add_argument("--venv", default=str(REPO / ".venv-torch-bench"))
    p.add_argument("--no-venv", action="store_true", help="use the running Python's packages")
    args = p.parse_args(argv)
    benchlib.check_batches_and_counts(p, args, ("seq", "threads", "rounds"))
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        benchlib.ensure_venv(__file__, args, REQUIREMENTS, IN_VENV_MARKER)
        try:
            import torch
            import transformers
        except ImportError as e:
            raise BenchError(f"{e}; run without --no-venv, or pip install -r {REQUIREMENTS}") from e
        torch.set_num_threads(args.threads)
        encore = benchlib.encore_executable(args)
        with benchlib.work_folder(args, "encore-torch-bench-") as workdir:
            model = benchlib.build_model(args, encore, workdir)
            twin, config = torch_twin(model)
            diff = check_twin(args, twin, model, config.vocab_size)
            log(f"PyTorch {torch.__version__} twin: {config.num_hidden_layers} layers x {config.hidden_size}, "
                f"max |PyTorch − onnxruntime| {diff:.2e}")
            rows = {b: {"encore": [], "torch": []} for b in args.batch_list}
            for r in range(args.rounds):
                for b in args.batch_list:
                    ours = bench_encore(args, encore, model, b)
                    ours["loadavg_1m_after"] = load_1m()
                    rows[b]["encore"].append(ours)
                    theirs = bench_torch(args, twin, config.vocab_size, b)
                    theirs["loadavg_1m_after"] = load_1m()
                    rows[b]["torch"].append(theirs)
                    log(f"round {r + 1}/{args.rounds} batch {b}: encore {ours['throughput_seq_per_s']:.2f}, "
                        f"PyTorch {theirs['throughput_seq_per_s']:.2f} seq/s")
            summary = summarize(rows)
            print(f"\ncpu: {benchlib.cpu_model()}")
            print(f"FP32, seq {args.seq}, {args.threads} threads, median of {args.rounds} interleaved rounds")
            print(f"{'batch':>5}  {'encore seq/s':>12}  {'PyTorch seq/s':>13}  {'encore/PyTorch':>14}  "
                  f"{'encore p50 ms':>13}  {'PyTorch p50 ms':>14}")
            for s in summary:
                print(f"{s['batch']:>5}  {s['encore_seq_per_s']:>12.2f}  {s['torch_seq_per_s']:>13.2f}  "
                      f"{s['ratio_encore_over_torch']:>14.2f}  {s['encore_p50_ms']:>13.2f}  {s['torch_p50_ms']:>14.2f}")
            if args.out:
                result = {
                    "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "machine": {"cpu": benchlib.cpu_model(), "logical_cpus": os.cpu_count(),
                                "python": platform.python_version(), "git_commit": benchlib.git_commit()},
                    "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                 "torch_parallel": torch.__config__.parallel_info()},
                    "settings": {"model": str(model), "seq": args.seq, "threads": args.threads,
                                 "batches": args.batch_list, "rounds": args.rounds, "seconds": args.seconds,
                                 "min_runs": args.min_runs, "warmup": args.warmup,
                                 "twin_max_abs_diff_vs_onnxruntime": diff},
                    "summary": summary,
                    "rounds": {str(b): v for b, v in rows.items()},
                }
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
                log(f"wrote {args.out}")
    except BenchError as e:
        print(f"bench_fp32_torch: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_fp32_torch: interrupted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
