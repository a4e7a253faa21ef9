#!/usr/bin/env python3
"""Load test of `encore serve` against a FastAPI + onnxruntime peer server, on one machine.

For each engine: start its server on 127.0.0.1, wait for `/health`, send `--requests` POST /embed
requests of 1 to `--max-texts` real texts each (movie-review snippets of
../shared/models/data/movie_sentiment/test.jsonl, drawn with a fixed seed) from `--clients`
concurrent clients, stop the server (SIGTERM), then check every answer:

* errors: any status other than 200, or a failed connection;
* lost or mismatched: a 200 whose rows are not one per text, or (encore) whose values are not
  bit-for-bit the rows `encore embed` writes for the same texts in one process (the server's
  answers must not depend on what shared their batch). Each JSON number is checked exactly: it
  must round to the reference f32.

Reports texts/s over the whole run, p50/p99 request latency, and for encore the mean batch the
batcher formed (from /metrics) and `encore bench` at that batch on the same text lengths: the
served throughput as a fraction of it (goal >= 90 %). The peer's rows are compared with ours by
cosine (a sanity check: it runs FP32 onnxruntime).

Engines: encore-int8 (MiniLM quantized by `encore quantize` on data/calibration), encore-fp32,
ort-fp32 (the same ONNX in onnxruntime), ort-int8 (the shared static QDQ MiniLM in onnxruntime).

    python3 scripts/load_test.py [--engines encore-int8,ort-fp32] [--requests 20000] [--clients 64]

The script installs its Python packages (scripts/requirements-serve-bench.txt) into its own venv
(.venv-serve-bench) and re-runs itself there; it builds the release CLI with cargo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

import benchlib
from benchlib import BenchError, log

benchlib.PROG = "load_test"
REPO = benchlib.REPO
REQUIREMENTS = REPO / "scripts" / "requirements-serve-bench.txt"
ENGINES = ("encore-int8", "encore-fp32", "ort-fp32", "ort-int8")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="encore-int8,ort-fp32", help=f"comma-separated, of {', '.join(ENGINES)}")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--max-texts", type=int, default=16, help="texts per request: 1 to this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="model threads of every server")
    p.add_argument("--max-length", type=int, default=256, help="truncation in tokens (MiniLM's 256)")
    p.add_argument("--models", default=os.environ.get("ENCORE_MODELS", str(REPO.parent / "shared" / "models")))
    p.add_argument("--workdir", default="/tmp/encore-load-test")
    p.add_argument("--out", help="write the markdown table here as well")
    p.add_argument("--json", help="write every figure as JSON here")
    p.add_argument("--bench-seconds", type=float, default=15.0)
    p.add_argument("--encore-bin", help="an encore executable instead of cargo build")
    p.add_argument("--timeout", type=float, default=3600.0, help="per step, seconds")
    p.add_argument("--venv", default=str(REPO / ".venv-serve-bench"))
    p.add_argument("--no-venv", action="store_true", help="use the current Python as it is")
    args = p.parse_args()
    bad = [e for e in args.engines.split(",") if e not in ENGINES]
    if bad:
        p.error(f"unknown engines {bad}; choose from {ENGINES}")
    if args.requests < 1 or args.clients < 1 or args.max_texts < 1:
        p.error("--requests, --clients and --max-texts must be at least 1")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    start = time.time()
    while time.time() - start < timeout:
        if proc.poll() is not None:
            raise BenchError(f"the server exited with {proc.returncode}:\n{benchlib.tail(log_path.read_text())}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise BenchError(f"the server was not healthy after {timeout:.0f} s:\n{benchlib.tail(log_path.read_text())}")


def stop(proc: subprocess.Popen, what: str) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise BenchError(f"{what} did not stop within 120 s of SIGTERM")


async def drive(url: str, bodies: list[bytes], clients: int) -> tuple[list[tuple[int, float, bytes]], float]:
    """Sends every body from `clients` concurrent clients; (status, seconds, body) per request
    in plan order, and the wall time of the whole run."""
    import aiohttp

    results: list[tuple[int, float, bytes] | None] = [None] * len(bodies)
    next_request = 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            nonlocal next_request
            while next_request < len(bodies):
                i = next_request
                next_request += 1
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=bodies[i], headers=headers) as r:
                        data = await r.read()
                        results[i] = (r.status, time.perf_counter() - t0, data)
                except Exception as e:  # a dropped connection is an error, not a crash
                    results[i] = (-1, time.perf_counter() - t0, repr(e).encode())

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return [r for r in results if r is not None], wall


def rounds_to(decimal: str, target) -> bool:
    """Whether the decimal string rounds to the f32 `target` (round to nearest, ties to even),
    decided in exact rational arithmetic."""
    import numpy as np

    t = np.float32(target)
    d = Fraction(decimal)
    x = Fraction(float(t))
    up = Fraction(float(np.nextafter(t, np.float32(np.inf))))
    down = Fraction(float(np.nextafter(t, np.float32(-np.inf))))
    lo, hi = (x + down) / 2, (x + up) / 2
    even = int(t.view(np.uint32)) % 2 == 0
    return lo < d < hi or (even and d in (lo, hi))


def check(results, plan, reference, exact: bool):
    """(errors, lost or mismatched, mean cosine to `reference`) over the answers."""
    import numpy as np

    errors = mismatched = 0
    cosines = []
    for (status, _, body), texts in zip(results, plan):
        if status != 200:
            errors += 1
            continue
        rows = np.asarray(json.loads(body), dtype=np.float64)
        if rows.ndim != 2 or rows.shape[0] != len(texts):
            mismatched += 1
            continue
        ref = reference[texts]
        got = rows.astype(np.float32)
        cosines.append(float(np.mean(np.sum(got * ref, axis=1) /
                                     (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)))))
        if exact and not np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
            # The fast path parses through f64; settle any difference exactly on the decimals.
            strings = json.loads(body, parse_float=str)
            ok = all(rounds_to(s, r) for row, rrow in zip(strings, ref) for s, r in zip(row, rrow))
            mismatched += 0 if ok else 1
    return errors, mismatched, (sum(cosines) / len(cosines) if cosines else float("nan"))


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def main() -> None:
    args = parse_args()
    benchlib.ensure_venv(__file__, args, REQUIREMENTS, "ENCORE_LOAD_TEST_VENV")
    import numpy as np

    models = Path(args.models)
    minilm = models / "minilm-l6"
    tokenizer = minilm / "tokenizer.json"
    data = models / "data" / "movie_sentiment" / "test.jsonl"
    if not tokenizer.is_file() or not data.is_file():
        raise BenchError(f"the shared models are missing at {models} (pass --models or set ENCORE_MODELS)")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    encore = benchlib.encore_executable(args)
    engines = args.engines.split(",")

    texts = [json.loads(line)["text"] for line in data.read_text().splitlines() if line.strip()]
    rng = random.Random(args.seed)
    plan = [rng.sample(range(len(texts)), rng.randint(1, args.max_texts)) for _ in range(args.requests)]
    bodies = [json.dumps({"inputs": [texts[i] for i in p]}).encode() for p in plan]
    total_texts = sum(len(p) for p in plan)
    log(f"{args.requests} requests, {total_texts} texts (mean {total_texts / args.requests:.2f} per request), "
        f"{args.clients} clients")

    int8 = work / "minilm.int8.encore"
    if "encore-int8" in engines and not int8.exists():
        benchlib.run_cmd([str(encore), "quantize", "--model", str(minilm / "model.onnx"), "--tokenizer", str(tokenizer),
                          "--calibration", str(models / "data" / "calibration" / "sentiment_train.jsonl"),
                          "--out", str(int8)], "encore quantize", timeout=args.timeout)
    encore_models = {"encore-int8": int8, "encore-fp32": minilm / "model.onnx"}

    # Single-process references: `encore embed` of every text (FP32 also for the peers' cosine).
    texts_file = work / "texts.jsonl"
    texts_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    references = {}
    for name in ["encore-fp32"] + [e for e in engines if e == "encore-int8"]:
        out = work / f"{name}.reference.npy"
        benchlib.run_cmd([str(encore), "embed", "--model", str(encore_models[name]), "--tokenizer", str(tokenizer),
                          "--input", str(texts_file), "--output", str(out), "--normalize",
                          "--max-length", str(args.max_length), "--threads", str(args.threads), "--quiet"],
                         f"encore embed ({name} reference)", timeout=args.timeout)
        references[name] = np.load(out)

    rows = []
    for engine in engines:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = work / f"{engine}.server.log"
        if engine.startswith("encore"):
            cmd = [str(encore), "serve", "--model", str(encore_models[engine]), "--tokenizer", str(tokenizer),
                   "--port", str(port), "--threads", str(args.threads), "--max-input-length", str(args.max_length),
                   "--max-client-batch-size", str(args.max_texts)]
            env = dict(os.environ)
        else:
            onnx = minilm / ("model.onnx" if engine == "ort-fp32" else "model.qdq.onnx")
            cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(REPO / "scripts"), "peer_server:app",
                   "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--log-level", "warning"]
            env = dict(os.environ, PEER_MODEL=str(onnx), PEER_TOKENIZER=str(tokenizer),
                       PEER_MAX_LENGTH=str(args.max_length), PEER_THREADS=str(args.threads))
        log(f"{engine}: {' '.join(cmd)}")
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
            try:
                wait_healthy(url, proc, log_path, timeout=300)
                load = os.getloadavg()[0]
                results, wall = asyncio.run(drive(url + "/embed", bodies, args.clients))
                metrics = scrape(url) if engine.startswith("encore") else {}
            finally:
                code = stop(proc, engine)
        exact = engine in references
        reference = references.get(engine, references["encore-fp32"])
        errors, mismatched, cosine = check(results, plan, reference, exact)
        latencies = [r[1] for r in results]
        row = {
            "engine": engine,
            "requests": len(results),
            "texts": total_texts,
            "errors": errors,
            "lost_or_mismatched": mismatched + (args.requests - len(results)),
            "bit_exact_checked": exact,
            "cosine_to_reference": cosine,
            "reference": "encore embed, same model" if exact else "encore embed FP32",
            "wall_s": wall,
            "texts_per_s": total_texts / wall,
            "p50_ms": 1e3 * percentile(latencies, 0.50),
            "p99_ms": 1e3 * percentile(latencies, 0.99),
            "exit_status": code,
            "load_1m_before": load,
        }
        if metrics.get("encore_batch_size_count"):
            mean_batch = metrics["encore_batch_size_sum"] / metrics["encore_batch_size_count"]
            row["mean_batch"] = mean_batch
            row["batches"] = metrics["encore_batch_size_count"]
            batch = max(1, round(mean_batch))
            out = benchlib.run_cmd(
                [str(encore), "bench", "--model", str(encore_models[engine]), "--batch", str(batch),
                 "--seq", str(args.max_length), "--lengths-from", str(data), "--tokenizer", str(tokenizer),
                 "--threads", str(args.threads), "--seconds", str(args.bench_seconds), "--json"],
                f"encore bench at the served mean batch {batch}", timeout=args.timeout)
            bench = json.loads(out)["throughput_seq_per_s"]
            row["bench_texts_per_s"] = bench
            row["served_over_bench"] = row["texts_per_s"] / bench
        log(f"{engine}: {json.dumps(row)}")
        rows.append(row)

    table = render(rows, args)
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": benchlib.cpu_model(), "commit": benchlib.git_commit(),
                                               "args": vars(args), "rows": rows}, indent=2))


def fmt(value: float | None, digits: int) -> str:
    """A figure, or `-` where the engine has none (the peer has no batcher or bench)."""
    return "-" if value is None else f"{value:.{digits}f}"


def render(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"Load test: {args.requests} requests of 1-{args.max_texts} movie snippets, {args.clients} concurrent "
        f"clients, {args.threads} model threads, truncation {args.max_length}; CPU: {benchlib.cpu_model()} "
        f"({os.cpu_count()} cores), commit {(benchlib.git_commit() or '?')[:10]}",
        "",
        "| server | errors | lost or mismatched | texts/s | p50 ms | p99 ms | mean batch | `encore bench` texts/s at that batch | served / bench | cosine to reference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        check = "bit-exact" if r["bit_exact_checked"] else "count only"
        lines.append(
            f"| {r['engine']} | {r['errors']} | {r['lost_or_mismatched']} ({check}) | {r['texts_per_s']:.1f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {fmt(r.get('mean_batch'), 1)} | "
            f"{fmt(r.get('bench_texts_per_s'), 1)} | {fmt(r.get('served_over_bench'), 2)} | "
            f"{r['cosine_to_reference']:.5f} ({r['reference']}) |")
    by = {r["engine"]: r for r in rows}
    for ours in ("encore-int8", "encore-fp32"):
        for peer in ("ort-fp32", "ort-int8"):
            if ours in by and peer in by:
                a, b = by[ours], by[peer]
                lines.append(f"\n{ours} / {peer}: {a['texts_per_s'] / b['texts_per_s']:.2f}x texts/s, "
                             f"p50 {a['p50_ms'] / b['p50_ms']:.2f}x, p99 {a['p99_ms'] / b['p99_ms']:.2f}x of the peer's latency")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        log(f"error: {e}")
        sys.exit(1)
