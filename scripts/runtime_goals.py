#!/usr/bin/env python3
"""Every measured goal of the runtime issue on this machine's CPU, in one run and one report.

The issue asks for its figures on every CPU model these machines show, each measured beside its
peers in the same run. This script runs, one after another (nothing else should run meanwhile):

  models        scripts/bench_models.py: BERT-base, DistilBERT-base and XLM-R-base shapes,
                sequence 128 at batch 1/8/32 and 384 at batch 1, every engine, interleaved rounds;
                goals: batch-1 p50 <= 0.8x OpenVINO INT8's, batch 8/32 throughput >= 1.25x, and
                >= 80 % of the `vpdpbusd` roofline
  padding-free  scripts/bench_int8.py on batches of 32 whose lengths follow the movie snippets
                (fixed seed), OpenVINO on the same batches padded to their longest: goal >= 2x
  memory        scripts/peak_memory.py: peak resident memory of BERT-base INT8, a fresh process
                per engine: goal: encore lowest
  load          the runtime's `load_time` example: `Model::load` + `Session` build of the compiled
                BERT-base INT8 file from a warm page cache: goal < 0.5 s
  jit           `encore bench --json`: the loop nests of one shape bucket compiled: goal < 100 ms
  scaling       `encore bench --json` at 1 and 2 threads, batch 8 and 1, per model (reported)
  fp32-torch    scripts/bench_fp32_torch.py: encore FP32 beside PyTorch eager FP32 (BERT-base);
                goal (our reading of "bring FP32 to the same standard"): >= 1.0x at batch 8 and 32
  kernels       `encore hwbench --json`, M = 1024, 1 thread, BERT-base's four GEMM shapes: the
                picked int8 kernel >= 85 % of the `vpdpbusd` peak (AMX counts against the same
                peak), and the picked f32 kernel >= 85 % of the FMA peak (the issue asks FP32 to
                be brought "to the same standard"), with PyTorch's own GEMM (torch.nn.functional
                .linear, 1 thread, in fp32-torch's venv) on the same shapes against the same peak

and writes OUT/goals.json (every figure, every verdict, the commands) and OUT/goals.md (one table:
goal, figure, verdict), beside each step's own output in OUT. A step that fails is reported as
failed, never as met. The whole run takes 35-45 minutes on a 2-core machine.

    python3 scripts/runtime_goals.py --out DIR [--encore-bin BIN] [--workdir DIR]
        [--presets bert-base,distilbert-base,xlm-roberta-base] [--rounds 2] [--seconds 3]
        [--skip STEP,...] [--report-only]

`--workdir` keeps the models between runs (one folder per preset, as bench_models.py uses it;
by default in the temporary folder, never in OUT, which holds only the record);
`--report-only` rewrites goals.md from OUT/goals.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_int8  # noqa: E402
import bench_models  # noqa: E402
import benchlib  # noqa: E402
from benchlib import REPO, BenchError, log, run_cmd  # noqa: E402

MODELS = Path(os.environ.get("ENCORE_MODELS", REPO.parent / "shared" / "models"))
INT8_VENV_PY = REPO / ".venv-int8-bench" / "bin" / "python"
TORCH_VENV_PY = REPO / ".venv-torch-bench" / "bin" / "python"
# PyTorch's own f32 GEMM (MKL / oneDNN) on one thread, the same shapes as hwbench's: the f32
# goal's reference, since the FMA peak loop may be out of any GEMM's reach on a CPU.
TORCH_GEMM = """
import json, sys, time, torch
torch.set_num_threads(1)
out = []
for n, k in json.loads(sys.argv[1]):
    a, w = torch.rand(1024, k), torch.rand(n, k)
    best = 0.0
    for _ in range(20):
        t = time.perf_counter(); torch.nn.functional.linear(a, w); s = time.perf_counter() - t
        best = max(best, 2 * 1024 * n * k / s / 1e9)
    out.append({"n": n, "k": k, "gflops": best})
print(json.dumps(out))
"""
STEPS = ["models", "padding-free", "memory", "load", "jit", "scaling", "fp32-torch", "kernels"]
# BERT-base's weight products: (N, K) of QKV, attention output, FFN1, FFN2.
BERT_SHAPES = [(768, 768), (2304, 768), (3072, 768), (768, 3072)]
PEER = bench_models.PEER

GOAL_PADDING_FREE = 2.0
GOAL_ROOFLINE = 0.80
GOAL_LOAD_S = 0.5
GOAL_JIT_MS = 100.0
GOAL_KERNEL = 0.85
GOAL_FP32_TORCH = 1.0


# ---------------------------------------------------------------------------------------------
# Verdicts: pure functions of the steps' outputs (tested in test_bench_int8.py).


def verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "NOT met")


def model_goals(rows: list[dict], presets: list[str] | None = None) -> list[dict]:
    """One goal line per bench_models row: batch 1 the latency goal, larger batches throughput
    and the roofline (of the best encore INT8 engine); with `presets`, a row bench_models.py
    should have measured and did not (a failed model build, a crashed engine) is a goal not met."""
    goals = []
    have = {(r["model"], r["seq"], r["batch"]) for r in rows}
    for preset in presets or []:
        for _, seq, batches in bench_models.RUNS:
            for b in (int(x) for x in batches.split(",")):
                if (preset, seq, b) not in have:
                    goals.append({"part": 8, "goal": f"{preset} seq {seq} batch {b}: beside OpenVINO INT8",
                                  "figure": "not measured", "met": False})
    for r in rows:
        where = f"{r['model']} seq {r['seq']} batch {r['batch']}"
        g = r.get("goal")
        if not g:
            goals.append({"part": 8, "goal": f"{where}: beside OpenVINO INT8", "figure": "not measured",
                          "met": False})
            continue
        if g["kind"] == "latency":
            goals.append({"part": 8, "goal": f"{where}: p50 <= {g['ratio']:g}x OpenVINO INT8",
                          "figure": f"{g['best_ratio']:.2f}x ({g['best_engine']})", "met": g["met"]})
            continue
        goals.append({"part": 8, "goal": f"{where}: throughput >= {g['ratio']:g}x OpenVINO INT8",
                      "figure": f"{g['best_ratio']:.2f}x ({g['best_engine']})", "met": g["met"]})
        ours, peer = r["roofline"]
        goals.append({"part": 8, "goal": f"{where}: >= {GOAL_ROOFLINE:.0%} of the vpdpbusd roofline",
                      "figure": (f"{ours:.0%} (OpenVINO {peer:.0%})" if ours and peer else
                                 f"{ours:.0%}" if ours else "no peak measured"),
                      "met": bool(ours) and ours >= GOAL_ROOFLINE})
    return goals


def padding_free_goal(summary: list[dict]) -> dict:
    """bench_int8.py's real-length batches: the best encore INT8 engine over OpenVINO INT8 on the
    same batches padded to their longest."""
    s = summary[0]
    engines = s["engines"]
    best = bench_models.best_int8(engines)
    peer = (engines.get(PEER) or {}).get("seq_per_s")
    ratio = engines[best]["seq_per_s"] / peer if best and peer else None
    figure = (f"{ratio:.2f}x ({engines[best]['seq_per_s']:.1f} against {peer:.1f} seq/s; "
              f"{s.get('mean_real_tokens', 0):.1f} real tokens a sequence, padded to "
              f"{s.get('mean_padded_tokens', 0):.1f})" if ratio else "not measured")
    return {"part": 3, "goal": f"real-length batches of {s['batch']}: >= {GOAL_PADDING_FREE:g}x OpenVINO INT8 padded",
            "figure": figure, "met": ratio is not None and ratio >= GOAL_PADDING_FREE, "ratio": ratio}


MEMORY_LINE = re.compile(r"^(?P<name>.+?)\s+(?P<mib>\d+(?:\.\d+)?) MiB$")


def memory_goal(out: str) -> dict:
    """peak_memory.py's lines (`NAME  X MiB`): every encore INT8 figure below every peer's."""
    mib = {}
    for line in out.splitlines():
        m = MEMORY_LINE.match(line.strip())
        if m:
            mib[m["name"].strip()] = float(m["mib"])
    ours = {k: v for k, v in mib.items() if k.startswith("encore")}
    peers = {k: v for k, v in mib.items() if not k.startswith(("encore", "python"))}
    met = bool(ours) and bool(peers) and max(ours.values()) < min(peers.values())
    figure = "; ".join(f"{k} {v:.1f} MiB" for k, v in mib.items() if not k.startswith("python"))
    return {"part": 4, "goal": "peak resident memory of BERT-base INT8 (batch 8 x 128): encore lowest",
            "figure": figure or "not measured", "met": met, "mib": mib}


LOAD_LINE = re.compile(r"Model::load (?P<load>[\d.]+) s, Session build (?P<build>[\d.]+) s, "
                       r"first run \(1x128\) (?P<first>[\d.]+) s")


def load_goal(out: str) -> dict:
    m = LOAD_LINE.search(out)
    if not m:
        raise BenchError(f"load_time printed no timings:\n{benchlib.tail(out)}")
    load, build, first = float(m["load"]), float(m["build"]), float(m["first"])
    return {"part": 7, "goal": f"compiled BERT-base INT8 loaded and its session built in < {GOAL_LOAD_S:g} s",
            "figure": f"{load + build:.3f} s (load {load:.3f}, build {build:.3f}; first run {first:.3f})",
            "met": load + build < GOAL_LOAD_S}


def jit_goal(bench: dict) -> dict:
    ms, units = bench.get("jit_compile_ms"), bench.get("jit_units")
    why = bench.get("jit_unavailable")
    return {"part": 2, "goal": f"one shape bucket's loop nests JIT-compiled in < {GOAL_JIT_MS:g} ms (BERT-base INT8)",
            "figure": f"{units} nests in {ms:.1f} ms" if ms is not None else f"no JIT: {why}",
            "met": ms is not None and ms < GOAL_JIT_MS}


def kernel_goals(tables: list[list[dict]], torch_gemm: list[dict] | None = None) -> list[dict]:
    """hwbench tables, one per shape: the picked int8 kernel's GOPS over the `vpdpbusd` peak of
    the same table, and the picked f32 kernel's fraction of the FMA peak, on every shape;
    `torch_gemm` (GFLOPS per shape, PyTorch's own GEMM on one thread), rated against the same
    FMA peak, goes beside the f32 figure."""
    int8, f32, ref = [], [], []
    for rows in tables:
        fma = [r for r in rows if r.get("dtype") == "f32" and r.get("fraction_of_peak")]
        t = [x for x in torch_gemm or [] if rows and (x["n"], x["k"]) == (rows[0].get("n"), rows[0].get("k"))]
        if fma and t:
            ref.append(t[0]["gflops"] / (fma[0]["gops"] / fma[0]["fraction_of_peak"]))
        picked = [r for r in rows if r.get("picked") and r.get("dtype") == "int8"]
        peak = bench_int8.vnni_peak_of(rows)
        if picked and peak:
            p = picked[0]
            int8.append((p["kernel"], p["n"], p["k"], p["gops"] / peak))
        picked32 = [r for r in rows if r.get("picked") and r.get("dtype") == "f32"]
        if picked32:
            q = picked32[0]
            f32.append((q["kernel"], q["n"], q["k"], q["fraction_of_peak"]))
    return [{"part": 5, "goal": f"int8 GEMM (M = 1024, 1 thread, BERT-base shapes) >= {GOAL_KERNEL:.0%} of the vpdpbusd peak",
             "figure": ", ".join(f"{k} N={n} K={kk} {f:.0%}" for k, n, kk, f in int8) or "not measured",
             "met": len(int8) == len(tables) and bool(int8) and all(f >= GOAL_KERNEL for *_, f in int8)},
            {"part": 5, "goal": f"f32 GEMM (same shapes) >= {GOAL_KERNEL:.0%} of the FMA peak (our reading of "
                                "\"bring FP32 to the same standard\")",
             "figure": (", ".join(f"{k} N={n} K={kk} {f:.0%}" for k, n, kk, f in f32) or "not measured")
             + (f" (PyTorch's own GEMM on the same shapes: {min(ref):.0%}-{max(ref):.0%})" if ref else ""),
             "met": len(f32) == len(tables) and bool(f32) and all(f >= GOAL_KERNEL for *_, f in f32)}]


def fp32_goal(summary: list[dict]) -> dict:
    rows = {s["batch"]: s for s in summary}
    judged = [rows[b]["ratio_encore_over_torch"] for b in (8, 32) if b in rows]
    figure = ", ".join(f"batch {b} {s['ratio_encore_over_torch']:.2f}x "
                       f"({s['encore_seq_per_s']:.2f} / {s['torch_seq_per_s']:.2f} seq/s)"
                       for b, s in sorted(rows.items()))
    return {"part": 5, "goal": f"BERT-base FP32 >= {GOAL_FP32_TORCH:g}x PyTorch eager FP32 at batch 8 and 32",
            "figure": figure or "not measured",
            "met": len(judged) == 2 and all(r >= GOAL_FP32_TORCH for r in judged)}


def scaling_lines(results: dict) -> list[dict]:
    """`encore bench --json` at 1 and 2 threads per (model, batch): the speed-up (no goal)."""
    lines = []
    for (model, batch), by_threads in sorted(results.items()):
        one, two = by_threads.get(1), by_threads.get(2)
        if not (one and two):
            continue
        s1, s2 = one["throughput_seq_per_s"], two["throughput_seq_per_s"]
        lines.append({"part": 6, "goal": f"{model} INT8 batch {batch}: 1 -> 2 threads (reported)",
                      "figure": f"{s2 / s1:.2f}x ({s1:.1f} -> {s2:.1f} seq/s; p50 "
                                f"{one['latency_ms_p50']:.1f} -> {two['latency_ms_p50']:.1f} ms)",
                      "met": None})
    return lines


def write_report(report: dict, path: Path) -> None:
    cpu = report.get("cpu", {})
    lines = [f"# The runtime issue's goals on {cpu.get('model', 'an unknown CPU')}", "",
             f"{report.get('date_utc', '')}; CPU flags: "
             f"{', '.join(f for f, on in cpu.get('flags', {}).items() if on) or '-'}"
             + (f"; capped: {report['isa_caps']}" if report.get("isa_caps") else "")
             + f"; encore {report.get('encore_bin', '')} (commit {report.get('git_commit', '?')}).", "",
             "| part | goal | measured | verdict |", "|---|---|---|---|"]
    for g in report.get("goals", []):
        lines.append(f"| {g['part']} | {g['goal']} | {g['figure']} | {verdict(g['met'])} |")
    for step, err in report.get("failed", {}).items():
        lines.append(f"| - | step `{step}` | failed: {err.splitlines()[0][:200]} | NOT met |")
    judged = [g for g in report.get("goals", []) if g["met"] is not None]
    lines += ["", f"{sum(g['met'] for g in judged)} of {len(judged)} goals met"
              + (f", {len(report['failed'])} step(s) failed" if report.get("failed") else "") + "."]
    if report.get("skipped"):
        lines.append(f"Skipped: {', '.join(report['skipped'])}.")
    lines += ["", "Commands:", ""] + [f"    {c}" for c in report.get("commands", [])]
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# The steps


def model_file(work: Path, preset: str) -> Path:
    return work / preset / f"{preset}.int8-static-attn.encore"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="goals-results")
    p.add_argument("--encore-bin")
    p.add_argument("--workdir", help="models kept between runs, outside OUT so that OUT can be kept as "
                   "the record (default: encore-goals-models in the temporary folder)")
    p.add_argument("--presets", default="bert-base,distilbert-base,xlm-roberta-base")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip", default="", help=f"comma-separated steps not to run: {', '.join(STEPS)}")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per command")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    benchlib.PROG = "runtime_goals"
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_report(json.loads((out / "goals.json").read_text()), out / "goals.md")
        print((out / "goals.md").read_text())
        return 0
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - set(STEPS)
    if unknown:
        p.error(f"unknown steps {sorted(unknown)}; steps: {', '.join(STEPS)}")
    work = Path(args.workdir or Path(tempfile.gettempdir()) / "encore-goals-models").resolve()
    presets = args.presets.split(",")
    py = sys.executable
    report: dict = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "cpu": bench_int8.cpu_info(), "isa_caps": bench_int8.isa_caps(),
                    "goals": [], "failed": {}, "skipped": sorted(skip), "commands": []}
    report["git_commit"] = benchlib.git_commit()
    bin_ = benchlib.encore_executable(args)
    report["encore_bin"] = str(bin_)
    common = ["--encore-bin", str(bin_)]

    def step(name: str, f) -> None:
        if name in skip:
            return
        log(name)
        try:
            f()
        except (BenchError, subprocess.SubprocessError, KeyError, ValueError, IndexError, OSError) as e:
            print(f"step {name} failed: {e}", file=sys.stderr)
            report["failed"][name] = f"{type(e).__name__}: {e}"
        (out / "goals.json").write_text(json.dumps(report, indent=2) + "\n")

    def record(c: list[str]) -> list[str]:
        report["commands"].append(" ".join(c))
        return c

    def run(c: list[str], what: str) -> str:
        """`c`'s stdout, the command kept in the report."""
        return run_cmd(record(c), what, args.timeout)

    def models() -> None:
        c = record([py, str(REPO / "scripts" / "bench_models.py"), "--out", str(out / "models"), "--presets",
                 args.presets, "--rounds", str(args.rounds), "--seconds", str(args.seconds), "--threads",
                 str(args.threads), "--workdir", str(work), *common])
        # bench_models.py keeps going past a failed engine: its rows say what was measured.
        subprocess.run(c, timeout=args.timeout * len(presets) * 2)
        rows, _ = bench_models.load_rows(out / "models", presets)
        report["goals"] += model_goals(rows, presets)

    def padding_free() -> None:
        f = out / "padding-free.json"
        run([py, str(REPO / "scripts" / "bench_int8.py"), *common, "--workdir", str(work / "bert-base"),
             "--batches", "32", "--threads", str(args.threads), "--rounds", str(max(args.rounds, 3)),
             "--seconds", str(args.seconds + 1), "--min-runs", "3", "--skip",
             "encore-fp32,ort-fp32,openvino-fp32,encore-int8,encore-int8-static", "--distinct-batches", "16",
             "--lengths-from", str(MODELS / "data" / "movie_sentiment" / "test.jsonl"),
             "--tokenizer", str(MODELS / "minilm-l6" / "tokenizer.json"), "--out", str(f)],
            "bench_int8.py (real lengths)")
        report["goals"].append(padding_free_goal(json.loads(f.read_text())["summary"]))

    def memory() -> None:
        vpy = str(INT8_VENV_PY) if INT8_VENV_PY.exists() else py
        o = run([vpy, str(REPO / "scripts" / "peak_memory.py"), "--workdir", str(work / "bert-base"),
                 "--threads", str(args.threads)], "peak_memory.py")
        (out / "memory.txt").write_text(o)
        report["goals"].append(memory_goal(o))

    def load() -> None:
        run_cmd(["cargo", "build", "--release", "-q", "-p", "runtime", "--example", "load_time"],
                "cargo build (load_time)", args.timeout)
        o = run([str(REPO / "target" / "release" / "examples" / "load_time"),
                 str(model_file(work, "bert-base")), "--threads", str(args.threads)], "load_time")
        report["goals"].append(load_goal(o))

    def bench(preset: str, batch: int, threads: int, seconds: float) -> dict:
        return bench_int8.last_json_line(run([str(bin_), "bench", "--model", str(model_file(work, preset)),
                                              "--batch", str(batch), "--seq", "128", "--threads", str(threads),
                                              "--seconds", f"{seconds:g}", "--min-runs", "3", "--json"],
                                             "encore bench"), "encore bench")

    def jit() -> None:
        report["goals"].append(jit_goal(bench("bert-base", 8, args.threads, 1)))

    def scaling() -> None:
        results: dict = {}
        for preset in presets:
            for batch in (8, 1):
                for threads in (1, 2):
                    results.setdefault((preset, batch), {})[threads] = bench(preset, batch, threads, args.seconds)
        report["goals"] += scaling_lines(results)

    def kernels() -> None:
        tables = [bench_int8.last_json_line(run([str(bin_), "hwbench", "--m", "1024", "--n", str(n), "--k",
                                                 str(k), "--threads", "1", "--json"], "encore hwbench"),
                                            "encore hwbench") for n, k in BERT_SHAPES]
        (out / "hwbench.json").write_text(json.dumps(tables, indent=1) + "\n")
        torch_gemm = None
        if TORCH_VENV_PY.exists():
            torch_gemm = bench_int8.last_json_line(
                run([str(TORCH_VENV_PY), "-c", TORCH_GEMM, json.dumps(BERT_SHAPES)], "PyTorch GEMM"), "PyTorch GEMM")
            report["torch_gemm_gflops"] = torch_gemm
        report["goals"] += kernel_goals(tables, torch_gemm)

    def fp32_torch() -> None:
        f = out / "fp32-torch.json"
        run([py, str(REPO / "scripts" / "bench_fp32_torch.py"), *common, "--batches", "1,8,32",
             "--threads", str(args.threads), "--rounds", str(args.rounds), "--seconds",
             str(args.seconds + 1), "--min-runs", "3", "--workdir", str(work / "torch"),
             "--out", str(f)], "bench_fp32_torch.py")
        report["goals"].append(fp32_goal(json.loads(f.read_text())["summary"]))

    for name, f in [("models", models), ("padding-free", padding_free), ("memory", memory), ("load", load),
                    ("jit", jit), ("scaling", scaling), ("fp32-torch", fp32_torch), ("kernels", kernels)]:
        step(name, f)
    write_report(report, out / "goals.md")
    print((out / "goals.md").read_text())
    judged = [g for g in report["goals"] if g["met"] is not None]
    return 0 if judged and all(g["met"] for g in judged) and not report["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
