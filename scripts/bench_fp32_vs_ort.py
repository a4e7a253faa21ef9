#!/usr/bin/env python3
"""FP32 throughput of encore against ONNX Runtime on the same BERT-base-shaped model.

Usage (from anywhere; paths are relative to the repository root):

    python3 scripts/bench_fp32_vs_ort.py                      # bert-base, batch 1/8/32, seq 128
    python3 scripts/bench_fp32_vs_ort.py --batches 1,8 --rounds 2 --seconds 3 --out bench.json
    python3 scripts/bench_fp32_vs_ort.py --model m.onnx       # an existing model, no build-model

What it does:

1. Creates a virtualenv (default .venv-bench in the repository root, `python3 -m venv`), installs
   scripts/requirements-bench.txt (pinned onnxruntime and numpy) and re-runs itself inside it.
   `--no-venv` uses the running Python as it is.
2. Builds the encore CLI (`cargo build --release --bin encore`) once, then writes the model with
   `encore build-model --preset bert-base --out <dir>/bert-base.onnx` (the same as
   `cargo run --release -- build-model ...`, without re-checking the build on every call).
3. For each round and each batch size, interleaved (ours, ORT, ours, ORT, ...):
   - ours: `encore bench --model M --batch B --seq S --threads T --json`, one JSON line with
     `throughput_seq_per_s` and `latency_ms_p50/p90/p99`;
   - ORT, in this process: `intra_op_num_threads=T`, `inter_op_num_threads=1`, `ORT_ENABLE_ALL`,
     sequential execution; warm-up runs, then timed runs for at least `--seconds` and
     `--min-runs`, the same protocol as `encore bench`.
   Inputs are random ids in [5, vocab) with a full attention mask and token type 0, as
   `encore bench` feeds them (`--mask padded` gives ORT right-padded rows of 50-100% length).
4. Prints a table (median over rounds of each side's throughput, and the ratio ours/ORT) and, with
   `--out FILE`, writes every measurement as JSON.

Exit status: 0 when every measurement ran, 1 on any failure (the message says which step, and
shows the end of the failing command's output), 2 on bad arguments.
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

REQUIREMENTS = REPO / "scripts" / "requirements-bench.txt"
IN_VENV_MARKER = "ENCORE_BENCH_IN_VENV"


# ---------------------------------------------------------------------------------------------
# Step 1: the virtualenv


def ensure_venv(args: argparse.Namespace) -> None:
    """Re-executes this script inside the bench venv, creating and filling it first if needed."""
    benchlib.ensure_venv(__file__, args, REQUIREMENTS, IN_VENV_MARKER)


# ---------------------------------------------------------------------------------------------
# Step 2: the CLI and the model


def build_model(args: argparse.Namespace, encore: Path, workdir: Path) -> Path:
    extra = []
    if args.opset:
        extra += ["--opset", str(args.opset)]
    if args.vocab:
        extra += ["--vocab", str(args.vocab)]
    return benchlib.build_model(args, encore, workdir, extra)


# ---------------------------------------------------------------------------------------------
# Step 3: measurements


REQUIRED_KEYS = ("throughput_seq_per_s", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99")


def bench_ours(args: argparse.Namespace, encore: Path, model: Path, batch: int) -> dict:
    cmd = [
        str(encore), "bench", "--model", str(model), "--batch", str(batch), "--seq", str(args.seq),
        "--threads", str(args.threads), "--seconds", str(args.seconds), "--min-runs", str(args.min_runs),
        "--warmup", str(args.warmup), "--json",
    ]
    out = run_cmd(cmd, f"encore bench batch {batch}", timeout=args.timeout)
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchError(f"encore bench printed invalid JSON: {e}\n{tail(out)}") from e
            missing = [k for k in REQUIRED_KEYS if k not in result]
            if missing:
                raise BenchError(f"encore bench JSON lacks {missing}: {line}")
            return result
    raise BenchError(f"encore bench printed no JSON object:\n{tail(out)}")


class OrtRunner:
    """One ORT session for the whole run, measured with the protocol of `encore bench`."""

    def __init__(self, args: argparse.Namespace, model: Path):
        import numpy as np
        import onnxruntime as ort

        self.np, self.ort, self.args = np, ort, args
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        t0 = time.perf_counter()
        try:
            self.session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT raises its own exception types
            raise BenchError(f"onnxruntime could not load {model}: {e}") from e
        self.load_s = time.perf_counter() - t0
        self.inputs = [i.name for i in self.session.get_inputs()]
        unknown = set(self.inputs) - {"input_ids", "attention_mask", "token_type_ids"}
        if unknown:
            raise BenchError(f"the model has inputs the bench cannot fill: {sorted(unknown)}")

    def feeds(self, batch: int) -> dict:
        np, args = self.np, self.args
        rng = np.random.default_rng(batch)
        vocab = args.vocab or 1000
        ids = rng.integers(5, vocab, size=(batch, args.seq), dtype=np.int64)
        mask = np.ones((batch, args.seq), dtype=np.int64)
        if args.mask == "padded":
            lengths = rng.integers(args.seq // 2, args.seq + 1, size=batch)
            lengths[0] = args.seq
            for b, n in enumerate(lengths):
                mask[b, n:] = 0
                ids[b, n:] = 0
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {k: v for k, v in feeds.items() if k in self.inputs}

    def bench(self, batch: int) -> dict:
        args, feeds = self.args, self.feeds(batch)
        try:
            for _ in range(args.warmup):
                self.session.run(None, feeds)
            lat = []
            start = time.perf_counter()
            while len(lat) < max(args.min_runs, 1) or time.perf_counter() - start < args.seconds:
                t = time.perf_counter()
                self.session.run(None, feeds)
                lat.append((time.perf_counter() - t) * 1e3)
                if time.perf_counter() - start > args.timeout:
                    raise BenchError(f"onnxruntime batch {batch}: over --timeout {args.timeout} s")
        except BenchError:
            raise
        except Exception as e:
            raise BenchError(f"onnxruntime run failed at batch {batch}: {e}") from e
        lat_sorted = sorted(lat)

        def pct(p: float) -> float:
            return lat_sorted[min(len(lat_sorted) - 1, round(p / 100 * (len(lat_sorted) - 1)))]

        return {
            "runs": len(lat),
            "throughput_seq_per_s": len(lat) * batch / (sum(lat) / 1e3),
            "latency_ms_mean": sum(lat) / len(lat),
            "latency_ms_p50": pct(50),
            "latency_ms_p90": pct(90),
            "latency_ms_p99": pct(99),
        }


# ---------------------------------------------------------------------------------------------
# Step 4: report


def machine_info() -> dict:
    return {"cpu": benchlib.cpu_model(), "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "git_commit": benchlib.git_commit()}


def summarize(rows: dict[int, dict[str, list[dict]]]) -> list[dict]:
    summary = []
    for batch, sides in rows.items():
        ours = statistics.median(r["throughput_seq_per_s"] for r in sides["ours"])
        ort = statistics.median(r["throughput_seq_per_s"] for r in sides["ort"])
        summary.append({
            "batch": batch,
            "ours_seq_per_s": ours,
            "ort_seq_per_s": ort,
            "ratio_ours_over_ort": ours / ort if ort > 0 else float("nan"),
            "ours_p50_ms": statistics.median(r["latency_ms_p50"] for r in sides["ours"]),
            "ort_p50_ms": statistics.median(r["latency_ms_p50"] for r in sides["ort"]),
            "rounds": len(sides["ours"]),
        })
    return summary


def print_table(summary: list[dict], args: argparse.Namespace) -> None:
    print(f"\nFP32, seq {args.seq}, {args.threads} threads, median of {args.rounds} interleaved rounds")
    print(f"{'batch':>5}  {'encore seq/s':>12}  {'ORT seq/s':>10}  {'ours/ORT':>8}  {'encore p50 ms':>13}  {'ORT p50 ms':>10}")
    for s in summary:
        print(
            f"{s['batch']:>5}  {s['ours_seq_per_s']:>12.2f}  {s['ort_seq_per_s']:>10.2f}  "
            f"{s['ratio_ours_over_ort']:>8.3f}  {s['ours_p50_ms']:>13.2f}  {s['ort_p50_ms']:>10.2f}"
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="bert-base", help="encore build-model preset (default bert-base)")
    p.add_argument("--model", help="use this ONNX file instead of building one")
    p.add_argument("--opset", type=int, choices=(14, 17), help="build-model --opset (default: the preset's, 17)")
    p.add_argument("--vocab", type=int, help="build-model --vocab; also the id range of the ORT inputs (default 1000)")
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes (default 1,8,32)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per batch (default 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="minimum timed seconds per measurement")
    p.add_argument("--min-runs", type=int, default=5, help="minimum timed runs per measurement")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--mask", choices=("full", "padded"), default="full",
                   help="ORT attention mask: full (as encore bench feeds) or right-padded rows")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per command or measurement")
    p.add_argument("--out", help="write all results as JSON here")
    p.add_argument("--workdir", help="where the built model goes (default: a temporary folder, removed after)")
    p.add_argument("--encore-bin", help="use this encore executable instead of building one")
    p.add_argument("--venv", default=str(REPO / ".venv-bench"))
    p.add_argument("--no-venv", action="store_true", help="use the running Python's packages")
    args = p.parse_args(argv)
    benchlib.check_batches_and_counts(p, args, ("seq", "threads", "rounds"))
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        ensure_venv(args)
        try:
            import numpy  # noqa: F401
            import onnxruntime as ort
        except ImportError as e:
            raise BenchError(f"{e}; run without --no-venv, or pip install -r {REQUIREMENTS}") from e
        encore = benchlib.encore_executable(args)
        with benchlib.work_folder(args, "encore-bench-") as workdir:
            model = build_model(args, encore, workdir)
            runner = OrtRunner(args, model)
            log(f"onnxruntime {ort.__version__} loaded the model in {runner.load_s:.1f} s")
            rows: dict[int, dict[str, list[dict]]] = {b: {"ours": [], "ort": []} for b in args.batch_list}
            for r in range(args.rounds):
                for b in args.batch_list:
                    ours = bench_ours(args, encore, model, b)
                    ours["loadavg_1m_after"] = load_1m()
                    rows[b]["ours"].append(ours)
                    log(f"round {r + 1}/{args.rounds} batch {b}: encore {ours['throughput_seq_per_s']:.2f} seq/s")
                    theirs = runner.bench(b)
                    theirs["loadavg_1m_after"] = load_1m()
                    rows[b]["ort"].append(theirs)
                    log(f"round {r + 1}/{args.rounds} batch {b}: ORT    {theirs['throughput_seq_per_s']:.2f} seq/s")
            summary = summarize(rows)
            print_table(summary, args)
            loads = [r["loadavg_1m_after"] for v in rows.values() for side in v.values() for r in side]
            loads = [x for x in loads if x is not None]
            if loads and max(loads) > (os.cpu_count() or 1):
                print(
                    f"warning: 1-minute load average reached {max(loads):.1f} on {os.cpu_count()} CPUs "
                    "during the run; other processes competed for the cores, so the figures are noisy"
                )
            if args.out:
                result = {
                    "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "machine": machine_info(),
                    "onnxruntime": ort.__version__,
                    "settings": {
                        "model": str(model), "preset": None if args.model else args.preset,
                        "model_bytes": model.stat().st_size, "seq": args.seq, "threads": args.threads,
                        "batches": args.batch_list, "rounds": args.rounds, "seconds": args.seconds,
                        "min_runs": args.min_runs, "warmup": args.warmup, "ort_mask": args.mask,
                        "ort_session": {"intra_op_num_threads": args.threads, "inter_op_num_threads": 1,
                                        "graph_optimization_level": "ORT_ENABLE_ALL"},
                    },
                    "summary": summary,
                    "rounds": {str(b): v for b, v in rows.items()},
                }
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
                log(f"wrote {args.out}")
    except BenchError as e:
        print(f"bench_fp32_vs_ort: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench_fp32_vs_ort: interrupted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
