#!/usr/bin/env python3
"""INT8 throughput of encore beside ONNX Runtime and OpenVINO+NNCF, in one interleaved run.

Usage (from anywhere; paths are relative to the repository root):

    python3 scripts/bench_int8.py                              # bert-base, batch 1/8/32, seq 128, 2 threads
    python3 scripts/bench_int8.py --batches 1,8 --rounds 1 --seconds 3 --out int8.json
    python3 scripts/bench_int8.py --model m.onnx               # an existing model, no build-model
    python3 scripts/bench_int8.py --skip openvino-fp32,ort-fp32

What it does:

1. Creates a virtualenv (default .venv-int8-bench in the repository root, `python3 -m venv`),
   installs scripts/requirements-int8-bench.txt (pinned onnxruntime, onnx, sympy, numpy, openvino, nncf)
   and re-runs itself inside it. `--no-venv` uses the running Python as it is.
2. Builds the encore CLI (`cargo build --release --bin encore`) once and copies the executable
   into the work folder, so that a rebuild by someone else during the run cannot swap it; then
   writes the model with `encore build-model --preset bert-base --out <dir>/bert-base.onnx`.
3. Prepares each engine (a failure here marks that engine failed, shows why, and the others go on):
   - encore-fp32:        nothing;
   - encore-int8:        `encore quantize --model M --random-calibration 64 --seq S --out <dir>/<name>.int8.encore`;
   - encore-int8-static: the same with `--activations static` (per-tensor ranges from calibration);
   - encore-int8-static-attn: static, and the attention products in int8 (`--attention int8`);
   - ort-fp32:           onnxruntime session, intra_op_num_threads=T, inter_op_num_threads=1,
                         ORT_ENABLE_ALL, sequential execution;
   - ort-int8-dynamic:   `quant_pre_process` (again with skip_symbolic_shape=True when symbolic shape
                         inference gives up, as it does on build-model's BERT; skipped with a note
                         when that fails too), `quantize_dynamic(weight_type=QInt8)`, then a
                         session as for ort-fp32;
   - openvino-fp32:      `core.read_model(M)`, reshaped to each (batch, seq) and compiled for CPU with
                         INFERENCE_NUM_THREADS=T, PERFORMANCE_HINT=LATENCY, NUM_STREAMS=1 and
                         INFERENCE_PRECISION_HINT=f32 (OpenVINO's default on bf16/AMX CPUs is bf16;
                         `--ov-precision default` keeps the default);
   - openvino-int8-nncf: `nncf.quantize(model, nncf.Dataset(...), model_type=TRANSFORMER,
                         target_device=CPU, subset_size=N)` (SmoothQuant on, as NNCF does for
                         transformers) on `--calibration` random samples at the benchmark's sequence
                         length, then compiled as openvino-fp32.
   Also runs `encore hwbench --json --threads T` for the measured int8 (vpdpbusd) peak of T
   threads (gops / fraction_of_peak of its int8 rows; the best int8 kernel's GOPS when that is
   higher, i.e. the short peak loop was slowed; the 1-thread peak times T if T gives none), once
   before any engine is prepared and once after the rounds, keeping the higher: each is a lower
   bound, and a busy host can slow the short loop by half.
4. For each round, for each batch size, each engine in turn (interleaved): warm-up runs, then
   timed runs for at least `--seconds` and `--min-runs`, the protocol of `encore bench`. The
   encore engines are `encore bench --model ... --json`; the others run in this process on random
   ids in [5, vocab) (vocab from the model's word-embedding table), a full attention mask and
   token type 0, the same arrays for every engine (encore bench draws its own ids in the same
   range; with a full mask the values do not change the work done).
5. Prints the CPU model and its avx512_vnni / avx_vnni / amx flags, then per batch size a table
   (engine, median seq/s over the rounds, p50 latency, ratio to encore-int8 and to encore-fp32)
   and a roofline line: GEMM MACs of one BERT-base forward, 12 x (4*768*768 + 2*768*3072 +
   2*seq*768) per token, and the fraction of the measured int8 peak encore-int8 reached; then the
   fraction of the peak every INT8 engine's forward ran at (its GEMM MACs over its time), and the
   runtime issue's goal for the row (batch 1: p50 <= 0.8x OpenVINO INT8's; larger batches:
   throughput >= 1.25x), whether the best encore INT8 engine met it, the fraction of the peak the
   goal needs over the whole forward, and beside it the best bare GEMM of the same run (hwbench,
   M = 1024, no epilogue): the goal leaves 1 - needed/bare of its time for everything that is not
   a product (attention, epilogues, normalisations, embeddings). With `--out FILE`, writes every
   measurement as JSON (`summary[].goal`).

Real lengths (`--lengths-from FILE --tokenizer T`): instead of full `--seq` batches, every engine
cycles through `--distinct-batches` batches per batch size whose sequences have the token counts
of texts of FILE (drawn with a fixed seed by `encore bench --lengths-from`, truncated to --seq),
each batch padded to its longest text: encore computes only the real tokens (padding-free);
onnxruntime and OpenVINO run the padded batches, as their users do (OpenVINO compiled once per
distinct padded shape, its static-shape fast path). The roofline line is left out there.

    python3 scripts/bench_int8.py --batches 32 --lengths-from ../shared/models/data/movie_sentiment/test.jsonl \
        --tokenizer ../shared/models/minilm-l6/tokenizer.json

Exit status: 0 when every engine that was not skipped ran every measurement; 1 when any engine,
the hwbench peak, or a step before the measurements failed (the message says which, with the end
of the failing command's output; the other engines are still measured and reported); 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import benchlib
from benchlib import REPO, BenchError, load_1m, log, run_cmd, tail

REQUIREMENTS = REPO / "scripts" / "requirements-int8-bench.txt"
IN_VENV_MARKER = "ENCORE_INT8_BENCH_IN_VENV"
benchlib.PROG = "bench_int8"

ENGINES = (
    "encore-fp32",
    "encore-int8",
    "encore-int8-static",
    "encore-int8-static-attn",
    "ort-fp32",
    "ort-int8-dynamic",
    "openvino-fp32",
    "openvino-int8-nncf",
)
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")

# BERT-base GEMM shapes for the roofline line.
BERT_LAYERS, BERT_HIDDEN, BERT_FFN = 12, 768, 3072


def last_json_line(out: str, what: str):
    """The last line of `out` that parses as JSON (an object or an array)."""
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchError(f"{what} printed invalid JSON: {e}\n{tail(out)}") from e
    raise BenchError(f"{what} printed no JSON:\n{tail(out)}")


# ---------------------------------------------------------------------------------------------
# Step 1: the virtualenv


def ensure_venv(args: argparse.Namespace) -> None:
    """Re-executes this script inside the bench venv, creating and filling it first if needed."""
    benchlib.ensure_venv(__file__, args, REQUIREMENTS, IN_VENV_MARKER)


# ---------------------------------------------------------------------------------------------
# Step 2: the CLI and the model


def build_encore(args: argparse.Namespace, workdir: Path) -> Path:
    exe = benchlib.encore_executable(args)
    # A private copy: others may rebuild target/release/encore while the rounds run.
    copy = workdir / "encore"
    shutil.copy2(exe, copy)
    log(f"using {exe} (copied to {copy})")
    return copy


def build_model(args: argparse.Namespace, encore: Path, workdir: Path) -> Path:
    return benchlib.build_model(args, encore, workdir)


def model_facts(model: Path) -> dict:
    """Vocabulary (rows of the table that `input_ids` indexes), hidden size and graph inputs."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    # Names that carry input_ids (through Cast/Identity/Reshape-like one-input ops).
    carriers = {"input_ids"}
    changed = True
    while changed:
        changed = False
        for n in m.graph.node:
            if n.op_type in ("Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten") and n.input \
                    and n.input[0] in carriers:
                for o in n.output:
                    if o not in carriers:
                        carriers.add(o)
                        changed = True
    vocab = hidden = None
    for n in m.graph.node:
        if n.op_type == "Gather" and len(n.input) >= 2 and n.input[1] in carriers and n.input[0] in inits:
            dims = inits[n.input[0]]
            if len(dims) == 2:
                vocab, hidden = dims
                break
    if vocab is None:
        for name, dims in inits.items():
            if "word_embeddings" in name and len(dims) == 2:
                vocab, hidden = dims
                break
    init_names = set(inits)
    inputs = [i.name for i in m.graph.input if i.name not in init_names]
    # The roofline's work: every MatMul/Gemm with a 2-D weight initializer runs once per token
    # (K x N multiply-adds), except the pooler and classifier heads, which run once per
    # sequence; attention adds 2 x seq x hidden per token and layer (Q.K^T and P.V), one layer
    # per Softmax.
    linear_macs = 0
    for n in m.graph.node:
        if n.op_type in ("MatMul", "Gemm") and len(n.input) >= 2 and n.input[1] in inits:
            dims = inits[n.input[1]]
            if len(dims) == 2 and not any(h in n.input[1] for h in ("pooler", "classifier")):
                linear_macs += dims[0] * dims[1]
    layers = sum(1 for n in m.graph.node if n.op_type == "Softmax")
    return {"vocab": vocab, "hidden": hidden, "inputs": inputs,
            "linear_macs_per_token": linear_macs, "layers": layers}


# ---------------------------------------------------------------------------------------------
# Step 3: engines


def timed_loop(args: argparse.Namespace, batch: int, run_once, what: str, cycle: int = 1) -> dict:
    """`encore bench`'s protocol: warm-up runs, then timed runs for >= --seconds and --min-runs
    (and a whole number of `cycle`s: the distinct batches of real lengths each weigh the same)."""
    for _ in range(args.warmup * cycle):
        run_once()
    lat = []
    start = time.perf_counter()
    while len(lat) < max(args.min_runs, 1) or time.perf_counter() - start < args.seconds or len(lat) % cycle:
        t = time.perf_counter()
        run_once()
        lat.append((time.perf_counter() - t) * 1e3)
        if time.perf_counter() - start > args.timeout:
            raise BenchError(f"{what} batch {batch}: over --timeout {args.timeout} s")
    s = sorted(lat)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]

    return {
        "runs": len(lat),
        "throughput_seq_per_s": len(lat) * batch / (sum(lat) / 1e3),
        "latency_ms_mean": sum(lat) / len(lat),
        "latency_ms_p50": pct(50),
        "latency_ms_p90": pct(90),
        "latency_ms_p99": pct(99),
    }


class Inputs:
    """The same random arrays for every in-process engine, one set per batch size."""

    def __init__(self, args: argparse.Namespace, vocab: int, names: list[str]):
        import numpy as np

        self.np, self.args, self.vocab, self.names = np, args, vocab, names
        self.cache: dict[int, dict] = {}

    def feeds(self, batch: int) -> dict:
        if batch not in self.cache:
            self.cache[batch] = self.make(batch, seed=batch)
        return self.cache[batch]

    def batches(self, batch: int) -> list[dict]:
        """The feeds of each run in turn: one full batch, or the batches of real lengths."""
        lengths = getattr(self.args, "lengths", None)
        if not lengths:
            return [self.feeds(batch)]
        key = ("lengths", batch)
        if key not in self.cache:
            np = self.np
            out = []
            for i, ls in enumerate(lengths[batch]):
                rng = np.random.default_rng(1000 * batch + i)
                seq = max(ls)
                ids = rng.integers(5, max(self.vocab, 6), size=(batch, seq), dtype=np.int64)
                mask = (np.arange(seq)[None, :] < np.array(ls)[:, None]).astype(np.int64)
                feeds = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
                out.append({k: v for k, v in feeds.items() if k in self.names})
            self.cache[key] = out
        return self.cache[key]

    def make(self, batch: int, seed: int) -> dict:
        np = self.np
        rng = np.random.default_rng(seed)
        ids = rng.integers(5, max(self.vocab, 6), size=(batch, self.args.seq), dtype=np.int64)
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        return {k: v for k, v in feeds.items() if k in self.names}

    def calibration(self, n: int) -> list[dict]:
        return [self.make(1, seed=10_000 + i) for i in range(n)]


class Engine:
    name = ""

    def __init__(self, args: argparse.Namespace, ctx: dict):
        self.args, self.ctx = args, ctx
        self.info: dict = {}
        self.error: str | None = None

    def prepare(self) -> None:
        pass

    def bench(self, batch: int) -> dict:
        raise NotImplementedError


class EncoreEngine(Engine):
    precision = "fp32"

    def model_path(self) -> Path:
        return self.ctx["model"]

    def bench(self, batch: int) -> dict:
        a = self.args
        cmd = [
            str(self.ctx["encore"]), "bench", "--model", str(self.model_path()), "--batch", str(batch),
            "--seq", str(a.seq), "--threads", str(a.threads), "--seconds", str(a.seconds),
            "--min-runs", str(a.min_runs), "--warmup", str(a.warmup), "--json",
            *lengths_args(a),
        ]
        out = run_cmd(cmd, f"{self.name} bench batch {batch}", timeout=a.timeout)
        r = last_json_line(out, f"{self.name}: encore bench")
        if not isinstance(r, dict):
            raise BenchError(f"{self.name}: encore bench printed {type(r).__name__}, not an object:\n{tail(out)}")
        missing = [k for k in ("throughput_seq_per_s", "latency_ms_p50") if k not in r]
        if missing:
            raise BenchError(f"{self.name}: encore bench JSON lacks {missing}: {json.dumps(r)}")
        if a.lengths_from and r.get("lengths") != a.lengths[batch]:
            raise BenchError(f"{self.name}: encore bench drew other lengths than the peers run: {r.get('lengths')}")
        got = r.get("precision")
        if got is not None and got != self.precision:
            raise BenchError(
                f"{self.name}: encore bench reports \"precision\": {got!r}, expected {self.precision!r}; "
                f"the measurement would be mislabelled: {json.dumps(r)}"
            )
        return r


class EncoreFp32(EncoreEngine):
    name = "encore-fp32"


class EncoreInt8(EncoreEngine):
    name = "encore-int8"
    precision = "int8"
    # Extra `encore quantize` arguments (the default is dynamic per-token activations).
    quantize_args: tuple = ()
    suffix = "int8"

    def model_path(self) -> Path:
        return self.quantized

    def prepare(self) -> None:
        a, model = self.args, self.ctx["model"]
        self.quantized = self.ctx["workdir"] / f"{model.stem}.{self.suffix}.encore"
        cmd = [
            str(self.ctx["encore"]), "quantize", "--model", str(model),
            "--random-calibration", str(a.calibration), "--seq", str(a.seq), "--out", str(self.quantized),
            *self.quantize_args,
        ]
        t0 = time.perf_counter()
        run_cmd(cmd, "encore quantize", timeout=a.timeout)
        if not self.quantized.exists():
            raise BenchError(f"encore quantize exited 0 but wrote no {self.quantized}")
        self.info.update(quantize_s=time.perf_counter() - t0, quantized_bytes=self.quantized.stat().st_size,
                         quantize_command=" ".join(cmd))
        log(f"{self.name}: {self.quantized} ({self.quantized.stat().st_size / 1e6:.1f} MB) "
            f"in {self.info['quantize_s']:.1f} s")


class EncoreInt8Static(EncoreInt8):
    """Static per-tensor activation ranges from the calibration run (`--activations static`)."""
    name = "encore-int8-static"
    quantize_args = ("--activations", "static")
    suffix = "int8-static"


class EncoreInt8StaticAttn(EncoreInt8):
    """Static activations and the attention products in int8 (`--attention int8`)."""
    name = "encore-int8-static-attn"
    quantize_args = ("--activations", "static", "--attention", "int8")
    suffix = "int8-static-attn"


class OrtEngine(Engine):
    name = "ort-fp32"

    def session_model(self) -> Path:
        return self.ctx["model"]

    def prepare(self) -> None:
        import onnxruntime as ort

        a = self.args
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        path = self.session_model()
        t0 = time.perf_counter()
        try:
            self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT raises its own exception types
            raise BenchError(f"{self.name}: onnxruntime could not load {path}: {e}") from e
        self.info["session_load_s"] = time.perf_counter() - t0
        names = [i.name for i in self.session.get_inputs()]
        unknown = set(names) - set(INPUT_NAMES)
        if unknown:
            raise BenchError(f"{self.name}: the model has inputs the bench cannot fill: {sorted(unknown)}")
        log(f"{self.name}: session ready in {self.info['session_load_s']:.1f} s")

    def bench(self, batch: int) -> dict:
        batches = self.ctx["inputs"].batches(batch)
        turn = itertools.count()

        def once():
            self.session.run(None, batches[next(turn) % len(batches)])

        try:
            return timed_loop(self.args, batch, once, self.name, cycle=len(batches))
        except BenchError:
            raise
        except Exception as e:
            raise BenchError(f"{self.name}: run failed at batch {batch}: {e}") from e


def external_data_files(graph) -> set[str]:
    """The external-data file names the initializers of an ONNX graph point at."""
    import onnx

    names = set()
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names |= {entry.value for entry in tensor.external_data if entry.key == "location"}
    return names


class OrtInt8Dynamic(OrtEngine):
    name = "ort-int8-dynamic"

    def session_model(self) -> Path:
        return self.quantized

    def prepare(self) -> None:
        # onnxruntime's quantization tools leave temporary files (sym_shape_infer_temp.onnx,
        # external-data *.data) in the working directory: keep them in the work folder.
        import onnx

        workdir = self.ctx["workdir"]
        before = set(workdir.glob("*.data"))
        self.kept_data: set[str] = set()
        try:
            with contextlib.chdir(workdir):
                self._prepare()
        finally:
            # Each quantization leaves its own uuid-named external-data file (~420 MB for
            # BERT-base) that no kept model names: left there, a few runs fill the disk.
            pre = self.preprocessed_path()
            referenced = set(self.kept_data)
            if pre.exists():
                referenced |= external_data_files(onnx.load(str(pre), load_external_data=False).graph)
            for leftover in set(workdir.glob("*.data")) - before:
                if leftover.name not in referenced:
                    leftover.unlink()
            (workdir / "sym_shape_infer_temp.onnx").unlink(missing_ok=True)

    def preprocessed_path(self) -> Path:
        """Where `quant_pre_process` writes the model it prepares for quantization."""
        return self.ctx["workdir"] / f"{self.ctx['model'].stem}.ort-preprocessed.onnx"

    def _prepare(self) -> None:
        import onnx
        from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

        model, workdir = self.ctx["model"], self.ctx["workdir"]
        src = model
        pre = self.preprocessed_path()
        t0 = time.perf_counter()
        if self.args.ort_preprocess:
            # The full pre-processing first; symbolic shape inference gives up on some graphs, so
            # then once more without it; then the original model.
            notes = []
            for label, kwargs in (("full", {}), ("skip_symbolic_shape", {"skip_symbolic_shape": True})):
                try:
                    quant_pre_process(str(model), str(pre), **kwargs)
                except Exception as e:
                    notes.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
                    log(f"{self.name}: quant_pre_process failed: {notes[-1]}")
                    continue
                src = pre
                notes.append(f"{label}: ok")
                log(f"{self.name}: quant_pre_process ({label}) done in {time.perf_counter() - t0:.1f} s")
                break
            else:
                notes.append("quantizing the original model")
                log(f"{self.name}: quantizing the original model")
            self.info["pre_process"] = notes
        else:
            self.info["pre_process"] = "skipped (--no-ort-preprocess)"
        self.quantized = workdir / f"{model.stem}.ort-int8-dynamic.onnx"
        t1 = time.perf_counter()
        try:
            quantize_dynamic(str(src), str(self.quantized), weight_type=QuantType.QInt8)
        except Exception as e:
            raise BenchError(
                f"{self.name}: quantize_dynamic failed: {type(e).__name__}: {e}\n{tail(traceback.format_exc(), 12)}"
            ) from e
        self.info["quantize_s"] = time.perf_counter() - t1
        self.info["quantized_bytes"] = self.quantized.stat().st_size
        ops: dict[str, int] = {}
        quantized = onnx.load(str(self.quantized), load_external_data=False)
        self.kept_data = external_data_files(quantized.graph)
        for n in quantized.graph.node:
            if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear", "QAttention",
                             "MatMulIntegerToFloat", "DequantizeLinear", "QuantizeLinear"):
                ops[n.op_type] = ops.get(n.op_type, 0) + 1
        self.info["quantized_ops"] = ops
        if not ops:
            raise BenchError(f"{self.name}: quantize_dynamic left no quantized operators in {self.quantized}")
        log(f"{self.name}: {self.quantized} ({self.info['quantized_bytes'] / 1e6:.1f} MB, {ops}) "
            f"in {self.info['quantize_s']:.1f} s")
        super().prepare()


class OpenVinoEngine(Engine):
    name = "openvino-fp32"

    def ov_model(self, core):
        return core.read_model(str(self.ctx["model"]))

    def config(self) -> dict:
        c = {"INFERENCE_NUM_THREADS": self.args.threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if self.args.ov_precision != "default":
            c["INFERENCE_PRECISION_HINT"] = self.args.ov_precision
        return c

    def prepare(self) -> None:
        import openvino as ov

        core = ov.Core()
        t0 = time.perf_counter()
        try:
            model = self.ov_model(core)
        except BenchError:
            raise
        except Exception as e:
            raise BenchError(f"{self.name}: {type(e).__name__}: {e}\n{tail(traceback.format_exc(), 12)}") from e
        names = [p.get_any_name() for p in model.inputs]
        unknown = set(names) - set(INPUT_NAMES)
        if unknown:
            raise BenchError(f"{self.name}: the model has inputs the bench cannot fill: {sorted(unknown)}")
        self.info["fake_quantize_nodes"] = sum(1 for op in model.get_ops() if op.get_type_name() == "FakeQuantize")
        # One compiled model per batch size, static shapes (OpenVINO's fast path), compiled before
        # the timed rounds so that compilation is never inside a measurement.
        self.requests = {}
        config = self.config()
        self.info["config"] = {k: str(v) for k, v in config.items()}
        shapes = sorted({(b, f["input_ids"].shape[1]) for b in self.args.batch_list
                         for f in self.ctx["inputs"].batches(b)})
        for b, seq in shapes:
            try:
                model.reshape({n: [b, seq] for n in names})
                compiled = core.compile_model(model, "CPU", config)
            except Exception as e:
                raise BenchError(f"{self.name}: compiling for batch {b} x {seq} failed: {type(e).__name__}: {e}") from e
            if "compiled_properties" not in self.info:
                props = {}
                for key in ("INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_PRECISION_HINT",
                            "EXECUTION_MODE_HINT", "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING"):
                    try:
                        v = compiled.get_property(key)
                        props[key] = v.to_string() if hasattr(v, "to_string") else str(v)
                    except Exception:  # not every version knows every key
                        pass
                self.info["compiled_properties"] = props
                self.info["gemm_primitives"] = gemm_primitives(compiled)
            self.requests[(b, seq)] = (compiled, compiled.create_infer_request())
        self.info["prepare_s"] = time.perf_counter() - t0
        log(f"{self.name}: ready for batches {self.args.batch_list} in {self.info['prepare_s']:.1f} s "
            f"({self.info['compiled_properties']}; GEMM primitives {self.info['gemm_primitives']})")

    def bench(self, batch: int) -> dict:
        batches = self.ctx["inputs"].batches(batch)
        runs = [(self.requests[(batch, f["input_ids"].shape[1])][1], f) for f in batches]
        turn = itertools.count()

        def once():
            req, feeds = runs[next(turn) % len(runs)]
            req.infer(feeds, share_inputs=True)

        try:
            return timed_loop(self.args, batch, once, self.name, cycle=len(runs))
        except BenchError:
            raise
        except Exception as e:
            raise BenchError(f"{self.name}: run failed at batch {batch}: {e}") from e


def gemm_primitives(compiled) -> dict:
    """How many of the compiled model's GEMM nodes run on each oneDNN primitive (the ISA shows
    in the name: `brgemm_avx512_amx_I8` or `brgemm_avx512_I8`), from the runtime model's
    `primitiveType`; where `ONEDNN_MAX_CPU_ISA` caps OpenVINO's ISA, this shows that it took."""
    counts: dict[str, int] = {}
    try:
        ops = compiled.get_runtime_model().get_ops()
    except Exception as e:  # an older version without a runtime model: say so, not fatal
        return {"unavailable": f"{type(e).__name__}: {e}"}
    for op in ops:
        rt = op.get_rt_info()
        layer = rt["layerType"].astype(str) if "layerType" in rt else ""
        if layer not in ("FullyConnected", "MatMul", "Convolution"):
            continue
        prim = rt["primitiveType"].astype(str) if "primitiveType" in rt else "?"
        key = f"{layer}:{prim}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


class OpenVinoInt8Nncf(OpenVinoEngine):
    name = "openvino-int8-nncf"

    def ov_model(self, core):
        import nncf

        model = core.read_model(str(self.ctx["model"]))
        data = self.ctx["inputs"].calibration(self.args.calibration)
        t0 = time.perf_counter()
        log(f"{self.name}: nncf.quantize on {len(data)} random samples of seq {self.args.seq} "
            "(model_type=TRANSFORMER, target_device=CPU)")
        try:
            # NNCF draws its progress bars on stdout; keep stdout for the report.
            with contextlib.redirect_stdout(sys.stderr):
                q = nncf.quantize(
                    model,
                    nncf.Dataset(data),
                    model_type=nncf.ModelType.TRANSFORMER,
                    target_device=nncf.TargetDevice.CPU,
                    subset_size=len(data),
                )
        except Exception as e:
            raise BenchError(
                f"{self.name}: nncf.quantize failed: {type(e).__name__}: {e}\n{tail(traceback.format_exc(), 12)}"
            ) from e
        self.info["quantize_s"] = time.perf_counter() - t0
        log(f"{self.name}: quantized in {self.info['quantize_s']:.1f} s")
        return q

    def prepare(self) -> None:
        super().prepare()
        if not self.info.get("fake_quantize_nodes"):
            raise BenchError(f"{self.name}: nncf.quantize left no FakeQuantize nodes; the model would run in fp32")


ENGINE_CLASSES = {c.name: c for c in (EncoreFp32, EncoreInt8, EncoreInt8Static, EncoreInt8StaticAttn, OrtEngine, OrtInt8Dynamic, OpenVinoEngine,
                                      OpenVinoInt8Nncf)}


def lengths_args(args: argparse.Namespace) -> list[str]:
    if not args.lengths_from:
        return []
    return ["--lengths-from", args.lengths_from, "--tokenizer", args.tokenizer,
            "--distinct-batches", str(args.distinct_batches)]


def draw_lengths(args: argparse.Namespace, encore: Path, model: Path, batch: int) -> list[list[int]]:
    """The real lengths `encore bench --lengths-from` draws for `batch` (one untimed cycle)."""
    cmd = [str(encore), "bench", "--model", str(model), "--batch", str(batch), "--seq", str(args.seq),
           "--threads", str(args.threads), "--seconds", "0", "--min-runs", "1", "--warmup", "0", "--json",
           *lengths_args(args)]
    r = last_json_line(run_cmd(cmd, "encore bench (lengths)", timeout=args.timeout), "encore bench")
    if not isinstance(r, dict) or not isinstance(r.get("lengths"), list):
        raise BenchError(f"encore bench --lengths-from printed no lengths: {r}")
    return r["lengths"]


# ---------------------------------------------------------------------------------------------
# The int8 peak


def vnni_peak_of(rows: list) -> float | None:
    """The `vpdpbusd` peak (GOPS) behind hwbench's VNNI rows (gops / fraction_of_peak of the
    best-rated one), or None without any: beside a tile peak, the runtime issue's roofline."""
    vnni = [r for r in rows if isinstance(r, dict) and r.get("kernel") in ("avx512vnni", "avxvnni")
            and r.get("dtype") == "int8" and r.get("fraction_of_peak", 0) > 0 and r.get("gops", 0) > 0]
    if not vnni:
        return None
    best = max(vnni, key=lambda r: r["fraction_of_peak"])
    return best["gops"] / best["fraction_of_peak"]


def int8_peak(args: argparse.Namespace, encore: Path) -> dict:
    """The measured int8 peak of --threads threads (tdpbusd where the picker runs AMX, else
    vpdpbusd), from `encore hwbench --json`.

    hwbench prints one row per kernel with `gops` and `fraction_of_peak` (gops over the measured
    peak of that dtype and thread count), so the peak is gops / fraction_of_peak. An explicit peak
    field, if a later hwbench prints one, is used as it is. When the T-thread run gives no peak,
    the 1-thread peak times T is used.
    """

    def from_output(data, threads: int) -> tuple[float | None, str, dict]:
        extra: dict = {}
        if isinstance(data, dict):
            for key in ("vnni_ops_per_s", "int8_peak_ops_per_s"):
                if isinstance(data.get(key), (int, float)) and data[key] > 0:
                    return data[key] / 1e9, f"hwbench {key}", extra
            peak = data.get("peak")
            if isinstance(peak, dict):
                for key, scale in (("vnni_ops_per_s", 1e-9), ("vnni_gops", 1.0), ("int8_gops", 1.0)):
                    if isinstance(peak.get(key), (int, float)) and peak[key] > 0:
                        return peak[key] * scale, f"hwbench peak.{key}", extra
            rows = data.get("rows") or data.get("kernels") or []
        else:
            rows = data
        rows = [r for r in rows if isinstance(r, dict)]
        int8 = [r for r in rows if r.get("dtype") == "int8" and r.get("fraction_of_peak", 0) > 0 and r.get("gops", 0) > 0
                and r.get("threads", threads) == threads]
        f32 = [r for r in rows if r.get("dtype") == "f32" and r.get("fraction_of_peak", 0) > 0 and r.get("gops", 0) > 0]
        if f32:
            best = max(f32, key=lambda r: r["fraction_of_peak"])
            extra["fma_peak_gflops"] = best["gops"] / best["fraction_of_peak"]
        if int8:
            # The kernel the picker chose is what the model runs on (AMX where usable, whose
            # fraction is of the tile peak); otherwise the best-rated kernel.
            picked = [r for r in int8 if r.get("picked")]
            best = picked[0] if picked else max(int8, key=lambda r: r["fraction_of_peak"])
            extra["best_int8_kernel"] = {k: best.get(k) for k in ("kernel", "m", "n", "k", "gops", "fraction_of_peak")}
            loop = best["gops"] / best["fraction_of_peak"]
            extra["int8_unit_peak_gops"] = loop
            if best.get("kernel") == "amx":
                # The roofline is the `vpdpbusd` peak on every CPU: kept beside the tile's.
                vnni = vnni_peak_of(int8)
                if vnni:
                    extra["vnni_peak_gops"] = vnni
            if best["gops"] > loop:
                # No kernel outruns the instruction's peak: the short peak loop was slowed (a busy
                # CPU, a frequency change), so the best kernel is the better lower bound.
                log(f"note: hwbench's peak loop measured {loop:.1f} GOPS, below its {best['kernel']} kernel's "
                    f"{best['gops']:.1f} GOPS; using the kernel's figure as the peak")
                return best["gops"], f"hwbench {best['kernel']} kernel GOPS (above the peak loop's {loop:.1f})", extra
            unit = {"amx": "tdpbusd (AMX)", "avx2": "vpmaddwd (AVX2, no VNNI)"}.get(best["kernel"], "vpdpbusd")
            return loop, f"hwbench {unit} loop, from gops/fraction_of_peak of {best['kernel']}", extra
        return None, "", extra

    base = [str(encore), "hwbench", "--json"]
    out = run_cmd(base + ["--threads", str(args.threads)], "encore hwbench", timeout=args.timeout)
    data = last_json_line(out, "encore hwbench")
    peak, source, extra = from_output(data, args.threads)
    result = {"threads": args.threads, "hwbench": data, **extra}
    if peak is None and args.threads > 1:
        out = run_cmd(base + ["--threads", "1"], "encore hwbench (1 thread)", timeout=args.timeout)
        data1 = last_json_line(out, "encore hwbench")
        p1, source, _ = from_output(data1, 1)
        if p1 is not None:
            peak, source = p1 * args.threads, f"{source} on 1 thread x {args.threads}"
            result["hwbench_1_thread"] = data1
    if peak is None:
        raise BenchError(f"encore hwbench gave no int8 peak (no VNNI on this CPU?):\n{tail(out)}")
    result.update(int8_peak_gops=peak, source=source)
    return result


def remeasure_peak(args: argparse.Namespace, encore: Path, first: dict) -> dict:
    """The peak measured again after the rounds; the higher of the two is kept.

    Nothing runs faster than the instruction's peak, so each measurement is a lower bound, and a
    short loop that a busy host slowed (a vCPU taken away for the 0.1 s it runs: seen on the
    2-vCPU guests, the 2-thread loop at 470-720 GOPS between runs at 930) would make every
    fraction of the peak too high. Both figures are kept in the JSON.
    """
    try:
        again = int8_peak(args, encore)
    except BenchError as err:
        log(f"int8 peak after the rounds FAILED ({tail(str(err), 3)}); keeping the first")
        return first
    higher = again["int8_peak_gops"] > first["int8_peak_gops"]
    kept = dict(again if higher else first)
    kept["measured_gops"] = [first["int8_peak_gops"], again["int8_peak_gops"]]
    # The best bare GEMM likewise: the faster of its two runs, over the peak kept.
    bare = [m.get("best_int8_kernel") for m in (first, again) if m.get("best_int8_kernel")]
    if bare:
        best = dict(max(bare, key=lambda k: k.get("gops") or 0))
        best["fraction_of_peak"] = min(1.0, (best.get("gops") or 0) / kept["int8_peak_gops"])
        kept["best_int8_kernel"] = best
    vnni = [m["vnni_peak_gops"] for m in (first, again) if m.get("vnni_peak_gops")]
    if vnni:
        kept["vnni_peak_gops"] = max(vnni)
    kept["source"] += f" (the {'second' if higher else 'first'} of two measurements, before and after the rounds)"
    log(f"int8 peak after the rounds {again['int8_peak_gops']:.1f} GOPS; using {kept['int8_peak_gops']:.1f}")
    return kept


def gemm_macs_per_sequence(seq: int, facts: dict) -> int:
    """Multiply-adds of the model's products for one sequence of `seq` tokens (see model_facts);
    BERT-base's when the model's could not be counted."""
    if facts.get("linear_macs_per_token") and facts.get("layers") and facts.get("hidden"):
        per_token = facts["linear_macs_per_token"] + facts["layers"] * 2 * seq * facts["hidden"]
        return seq * per_token
    per_token_layer = 4 * BERT_HIDDEN * BERT_HIDDEN + 2 * BERT_HIDDEN * BERT_FFN + 2 * seq * BERT_HIDDEN
    return BERT_LAYERS * seq * per_token_layer


# ---------------------------------------------------------------------------------------------
# Report


def cpu_info() -> dict:
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
    return {"model": benchlib.cpu_model(), "flags": {f: f in flags for f in wanted}}


def machine_info() -> dict:
    return {"cpu": cpu_info(), "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "git_commit": benchlib.git_commit(), "isa_caps": isa_caps()}


ISA_CAP_VARS = ("ENCORE_KERNEL", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def isa_caps() -> dict:
    """The environment variables that narrow the engines' instruction sets, where set: on an
    AMX CPU, `ENCORE_KERNEL=avx512vnni` and `ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` (OpenVINO)
    compare both engines as they run on a CPU with AVX512-VNNI and no AMX."""
    return {v: os.environ[v] for v in ISA_CAP_VARS if v in os.environ}


def package_versions() -> dict:
    out = {}
    for mod in ("onnxruntime", "onnx", "numpy", "openvino", "nncf"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # a missing package is reported, not fatal here
            out[mod] = f"unavailable ({type(e).__name__})"
    return out


def forward_gops(macs: int, batch: int, seq_per_s: float) -> float:
    """The GEMM work rate of forwards of `macs` multiply-adds per batch of `batch` sequences run
    at `seq_per_s`: 2 operations per multiply-add, in GOPS."""
    return 2 * macs * seq_per_s / batch / 1e9


def summarize(args: argparse.Namespace, rows: dict, peak: dict | None) -> list[dict]:
    summary = []
    for b in args.batch_list:
        med = {}
        for eng, ms in rows[b].items():
            if ms:
                med[eng] = {
                    "seq_per_s": statistics.median(m["throughput_seq_per_s"] for m in ms),
                    "p50_ms": statistics.median(m["latency_ms_p50"] for m in ms),
                    "rounds": len(ms),
                }
        i8 = med.get("encore-int8", {}).get("seq_per_s")
        f32 = med.get("encore-fp32", {}).get("seq_per_s")
        for v in med.values():
            v["ratio_to_encore_int8"] = v["seq_per_s"] / i8 if i8 else None
            v["ratio_to_encore_fp32"] = v["seq_per_s"] / f32 if f32 else None
        if args.lengths_from:
            ls = args.lengths[b]
            summary.append({"batch": b, "engines": med, "roofline": None,
                            "mean_real_tokens": sum(map(sum, ls)) / (len(ls) * b),
                            "mean_padded_tokens": sum(max(x) for x in ls) / len(ls)})
            continue
        macs = gemm_macs_per_sequence(args.seq, args.facts) * b
        roof = {"gemm_macs_per_forward": macs, "gemm_gmacs_per_forward": macs / 1e9}
        if peak:
            roof["int8_peak_gops"] = peak["int8_peak_gops"]
        for eng in ("encore-int8", "encore-fp32"):
            if eng in med:
                gops = forward_gops(macs, b, med[eng]["seq_per_s"])
                roof[f"{eng}_gops"] = gops
                if eng == "encore-int8" and peak:
                    roof["encore_int8_fraction_of_int8_peak"] = gops / peak["int8_peak_gops"]
                if eng == "encore-fp32" and peak and peak.get("fma_peak_gflops"):
                    roof["encore_fp32_fraction_of_fma_peak"] = gops / peak["fma_peak_gflops"]
        if peak:
            # Every INT8 engine's throughput as a fraction of the peak: the same MACs at the
            # same `vpdpbusd` rate, so peers and encore read on one scale.
            for eng, v in med.items():
                if "int8" in eng:
                    v["fraction_of_int8_peak"] = forward_gops(macs, b, v["seq_per_s"]) / peak["int8_peak_gops"]
                    if peak.get("vnni_peak_gops"):
                        v["fraction_of_vnni_peak"] = forward_gops(macs, b, v["seq_per_s"]) / peak["vnni_peak_gops"]
        summary.append({"batch": b, "engines": med, "roofline": roof, "goal": goal_row(b, macs, med, peak)})
    return summary


# The runtime issue's goals against OpenVINO INT8, measured in the same run: throughput at batch
# 8 and more, p50 latency at batch 1.
GOAL_PEER = "openvino-int8-nncf"
GOAL_THROUGHPUT_RATIO = 1.25
GOAL_LATENCY_RATIO = 0.8


def goal_row(b: int, macs: int, med: dict, peak: dict | None) -> dict | None:
    """What the goal asks of this row and what it would take of the CPU.

    The goal's speed is turned into the fraction of the measured int8 peak the whole forward
    would have to run at (its GEMM MACs over its time), and set beside the best bare GEMM of
    the same run (hwbench's M = 1024 product, no epilogue, nothing else to do): a goal that
    needs more of the peak than a bare GEMM reaches cannot be met on this CPU by any schedule
    that does the model's MACs with `vpdpbusd`, since attention, the epilogues and the
    normalisations come on top of them; one just below it leaves them the rest of the time
    (`share_left_beside_bare_gemms`).
    """
    peer = med.get(GOAL_PEER)
    ours = {e: v for e, v in med.items() if e.startswith("encore-int8")}
    if not peer or not ours:
        return None
    if b == 1:
        target_ms = GOAL_LATENCY_RATIO * peer["p50_ms"]
        best = min(ours, key=lambda e: ours[e]["p50_ms"])
        row = {"kind": "latency", "ratio": GOAL_LATENCY_RATIO, "peer": GOAL_PEER,
               "target_p50_ms": target_ms, "best_engine": best,
               "best_ratio": ours[best]["p50_ms"] / peer["p50_ms"],
               "met": ours[best]["p50_ms"] <= target_ms}
        needed_gops = forward_gops(macs, b, b * 1e3 / target_ms)
    else:
        target = GOAL_THROUGHPUT_RATIO * peer["seq_per_s"]
        best = max(ours, key=lambda e: ours[e]["seq_per_s"])
        row = {"kind": "throughput", "ratio": GOAL_THROUGHPUT_RATIO, "peer": GOAL_PEER,
               "target_seq_per_s": target, "best_engine": best,
               "best_ratio": ours[best]["seq_per_s"] / peer["seq_per_s"],
               "met": ours[best]["seq_per_s"] >= target}
        needed_gops = forward_gops(macs, b, target)
    if peak:
        row["needed_fraction_of_int8_peak"] = needed_gops / peak["int8_peak_gops"]
        bare = (peak.get("best_int8_kernel") or {}).get("fraction_of_peak")
        if bare:
            row["bare_gemm_fraction_of_int8_peak"] = bare
            # Were the MACs all done at the bare GEMM's rate, this share of the goal's time
            # would be left for everything else (negative: not even the MACs fit).
            row["share_left_beside_bare_gemms"] = 1 - row["needed_fraction_of_int8_peak"] / bare
    return row


def fmt_ratio(x: float | None) -> str:
    return f"{x:.3f}" if x is not None else "-"


def print_report(args: argparse.Namespace, summary: list[dict], engines: list[Engine], peak: dict | None,
                 peak_error: str | None, versions: dict) -> None:
    cpu = cpu_info()
    flags = "  ".join(f"{f} {'yes' if v else 'no'}" for f, v in cpu["flags"].items()
                      if f in ("avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"))
    print(f"\nCPU: {cpu['model']} ({os.cpu_count()} logical CPUs)")
    print(f"     {flags}")
    caps = isa_caps()
    if caps:
        print("     instruction sets capped: " + ", ".join(f"{k}={v}" for k, v in caps.items()))
    print(f"INT8 vs FP32, seq {args.seq}, {args.threads} threads, median of {args.rounds} interleaved round(s), "
          f">= {args.seconds:g} s and {args.min_runs} runs each")
    print("     " + ", ".join(f"{k} {v.split('-')[0]}" for k, v in versions.items() if k != "numpy")
          + f"; OpenVINO inference precision: {args.ov_precision}")
    if peak:
        print(f"int8 peak: {peak['int8_peak_gops']:.1f} GOPS on {args.threads} threads ({peak['source']})")
    else:
        print(f"int8 peak: unknown ({peak_error})")
    failed = {e.name: e.error for e in engines if e.error}
    for s in summary:
        b = s["batch"]
        print(f"\nbatch {b}")
        print(f"  {'engine':<20} {'seq/s':>10} {'p50 ms':>10} {'/enc-int8':>10} {'/enc-fp32':>10}")
        for e in engines:
            v = s["engines"].get(e.name)
            if v is None:
                print(f"  {e.name:<20} {'failed' if e.name in failed else '-':>10}")
                continue
            print(f"  {e.name:<20} {v['seq_per_s']:>10.2f} {v['p50_ms']:>10.2f} "
                  f"{fmt_ratio(v['ratio_to_encore_int8']):>10} {fmt_ratio(v['ratio_to_encore_fp32']):>10}")
        r = s["roofline"]
        if r is None:
            print(f"  real lengths: {s['mean_real_tokens']:.1f} tokens per sequence, padded to "
                  f"{s['mean_padded_tokens']:.1f} ({len(args.lengths[b])} distinct batches)")
            continue
        line = f"  roofline: {r['gemm_gmacs_per_forward']:.2f} GMAC of GEMM per forward (batch {b} x seq {args.seq})"
        if "encore-int8_gops" in r:
            line += f"; encore-int8 {r['encore-int8_gops']:.1f} GOPS"
            if "encore_int8_fraction_of_int8_peak" in r:
                line += (f" = {100 * r['encore_int8_fraction_of_int8_peak']:.1f}% of the int8 peak "
                         f"{r['int8_peak_gops']:.1f} GOPS")
        else:
            line += "; encore-int8 not measured"
        if "encore_fp32_fraction_of_fma_peak" in r:
            line += (f" (encore-fp32 {r['encore-fp32_gops']:.1f} GFLOP/s = "
                     f"{100 * r['encore_fp32_fraction_of_fma_peak']:.1f}% of the FMA peak)")
        print(line)
        fractions = [f"{e} {100 * v['fraction_of_int8_peak']:.1f}%" for e, v in s["engines"].items()
                     if "fraction_of_int8_peak" in v]
        if fractions:
            print("  fraction of the int8 peak over the whole forward: " + ", ".join(fractions))
        vnni = [f"{e} {100 * v['fraction_of_vnni_peak']:.1f}%" for e, v in s["engines"].items()
                if "fraction_of_vnni_peak" in v]
        if vnni and peak:
            print(f"  of the vpdpbusd peak ({peak['vnni_peak_gops']:.1f} GOPS; the runtime issue's roofline, "
                  "goal >= 80% for encore): " + ", ".join(vnni))
        g = s.get("goal")
        if g:
            if g["kind"] == "latency":
                line = (f"  goal: p50 <= {g['ratio']:g}x {g['peer']} = {g['target_p50_ms']:.2f} ms; "
                        f"best {g['best_engine']} {g['best_ratio']:.3f}x ({'met' if g['met'] else 'not met'})")
            else:
                line = (f"  goal: >= {g['ratio']:g}x {g['peer']} = {g['target_seq_per_s']:.2f} seq/s; "
                        f"best {g['best_engine']} {g['best_ratio']:.3f}x ({'met' if g['met'] else 'not met'})")
            print(line)
            if "needed_fraction_of_int8_peak" in g:
                line = (f"        it needs {100 * g['needed_fraction_of_int8_peak']:.1f}% of the int8 peak "
                        "over the whole forward")
                if "bare_gemm_fraction_of_int8_peak" in g:
                    line += (f"; the best bare GEMM of this run reached "
                             f"{100 * g['bare_gemm_fraction_of_int8_peak']:.1f}%, which leaves "
                             f"{100 * g['share_left_beside_bare_gemms']:.1f}% of the goal's time for all "
                             "the rest (attention, epilogues, normalisations, embeddings)")
                print(line)
    if failed:
        print("\nfailed engines:")
        for name, err in failed.items():
            print(f"  {name}: " + err.replace("\n", "\n    "))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="bert-base", help="encore build-model preset (default bert-base)")
    p.add_argument("--model", help="use this ONNX file instead of building one")
    p.add_argument("--vocab", type=int, help="id range of the in-process engines' inputs (default: from the model)")
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes (default 1,8,32)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="minimum timed seconds per measurement")
    p.add_argument("--min-runs", type=int, default=5, help="minimum timed runs per measurement")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--skip", default="", help=f"comma-separated engines not to run: {', '.join(ENGINES)}")
    p.add_argument("--calibration", type=int, default=64,
                   help="random calibration samples for encore quantize and NNCF (default 64)")
    p.add_argument("--ov-precision", choices=("f32", "bf16", "default"), default="f32",
                   help="OpenVINO INFERENCE_PRECISION_HINT for the non-int8 parts (default f32; "
                        "'default' leaves OpenVINO's choice, bf16 on CPUs that have it)")
    p.add_argument("--no-ort-preprocess", dest="ort_preprocess", action="store_false",
                   help="quantize_dynamic without quant_pre_process first")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per command or measurement")
    p.add_argument("--out", help="write all results as JSON here")
    p.add_argument("--workdir", help="where models and the encore copy go (default: a temporary folder, removed after)")
    p.add_argument("--encore-bin", help="use this encore executable instead of building one")
    p.add_argument("--lengths-from", help="batches of the real token counts of this text file (see above)")
    p.add_argument("--tokenizer", help="the tokenizer.json that counts tokens for --lengths-from")
    p.add_argument("--distinct-batches", type=int, default=16, help="batches drawn per batch size (default 16)")
    p.add_argument("--venv", default=str(REPO / ".venv-int8-bench"))
    p.add_argument("--no-venv", action="store_true", help="use the running Python's packages")
    args = p.parse_args(argv)
    benchlib.check_batches_and_counts(p, args, ("seq", "threads", "rounds", "calibration"))
    if len(set(args.batch_list)) != len(args.batch_list):
        p.error("--batches lists a batch size twice")
    if args.seconds < 0 or args.warmup < 0 or args.min_runs < 1:
        p.error("--seconds and --warmup must be >= 0, --min-runs >= 1")
    args.skip_list = [s.strip() for s in args.skip.split(",") if s.strip()]
    bad = [s for s in args.skip_list if s not in ENGINES]
    if bad:
        p.error(f"--skip: unknown engine(s) {bad}; the engines are {', '.join(ENGINES)}")
    if args.lengths_from and not args.tokenizer:
        p.error("--lengths-from needs --tokenizer")
    for name in ("lengths_from", "tokenizer"):
        if getattr(args, name):
            setattr(args, name, str(Path(getattr(args, name)).resolve()))
    args.lengths = {}
    if set(args.skip_list) == set(ENGINES):
        p.error("--skip leaves no engine to run")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    failures: list[str] = []
    try:
        ensure_venv(args)
        try:
            import numpy  # noqa: F401
            import onnx  # noqa: F401
        except ImportError as e:
            raise BenchError(f"{e}; run without --no-venv, or pip install -r {REQUIREMENTS}") from e
        versions = package_versions()
        log("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        if args.threads > (os.cpu_count() or 1):
            log(f"warning: --threads {args.threads} is more than the {os.cpu_count()} logical CPUs")
        load0 = load_1m()
        if load0 is not None and load0 > 0.5 * (os.cpu_count() or 1):
            log(f"warning: 1-minute load average is {load0:.1f} on {os.cpu_count()} CPUs before starting")
        with benchlib.work_folder(args, "encore-int8-bench-") as workdir:
            encore = build_encore(args, workdir)
            model = build_model(args, encore, workdir)
            facts = model_facts(model)
            vocab = args.vocab or facts["vocab"]
            if not vocab:
                vocab = 1000
                log("warning: found no word-embedding table for input_ids; ids drawn from [5, 1000)")
            args.facts = facts
            if not (facts["linear_macs_per_token"] and facts["layers"]):
                log("warning: found no weight products or no Softmax; the roofline assumes BERT-base")
            log(f"model inputs {facts['inputs']}, vocab {vocab}, hidden {facts['hidden']}")
            if args.lengths_from:
                for b in args.batch_list:
                    args.lengths[b] = draw_lengths(args, encore, model, b)
                    ls = args.lengths[b]
                    log(f"batch {b}: {len(ls)} batches of real lengths, "
                        f"{sum(map(sum, ls)) / (len(ls) * b):.1f} tokens per sequence, "
                        f"padded to {sum(max(x) for x in ls) / len(ls):.1f}")
            ctx = {"encore": encore, "model": model, "workdir": workdir,
                   "inputs": Inputs(args, vocab, facts["inputs"])}

            # Before any peer is loaded: a peer's idle worker threads may still spin.
            peak, peak_error = None, None
            try:
                peak = int8_peak(args, encore)
                log(f"int8 peak {peak['int8_peak_gops']:.1f} GOPS on {args.threads} threads ({peak['source']})")
            except BenchError as err:
                peak_error = str(err)
                failures.append(f"int8 peak: {err}")
                log(f"int8 peak FAILED: {tail(peak_error, 12)}")

            engines = [ENGINE_CLASSES[n](args, ctx) for n in ENGINES if n not in args.skip_list]
            for e in engines:
                log(f"preparing {e.name}")
                try:
                    e.prepare()
                except BenchError as err:
                    e.error = f"preparation failed: {err}"
                except Exception as err:  # a peer library's own failure must not stop the others
                    e.error = f"preparation failed: {type(err).__name__}: {err}\n{tail(traceback.format_exc(), 12)}"
                if e.error:
                    log(f"{e.name} FAILED: {tail(e.error, 12)}")


            rows: dict[int, dict[str, list[dict]]] = {b: {e.name: [] for e in engines} for b in args.batch_list}
            for r in range(args.rounds):
                for b in args.batch_list:
                    for e in engines:
                        if e.error:
                            continue
                        try:
                            m = e.bench(b)
                        except BenchError as err:
                            e.error = f"round {r + 1} batch {b}: {err}"
                        except Exception as err:
                            e.error = f"round {r + 1} batch {b}: {type(err).__name__}: {err}"
                        if e.error:
                            log(f"{e.name} FAILED: {tail(e.error, 12)}")
                            continue
                        m["loadavg_1m_after"] = load_1m()
                        m["round"] = r + 1
                        rows[b][e.name].append(m)
                        log(f"round {r + 1}/{args.rounds} batch {b}: {e.name:<20} "
                            f"{m['throughput_seq_per_s']:10.2f} seq/s")

            if peak is not None:
                peak = remeasure_peak(args, encore, peak)
            summary = summarize(args, rows, peak)
            print_report(args, summary, engines, peak, peak_error, versions)
            failures += [f"{e.name}: {e.error}" for e in engines if e.error]
            loads = [m["loadavg_1m_after"] for v in rows.values() for ms in v.values() for m in ms]
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
                    "versions": versions,
                    "settings": {
                        "model": str(model), "preset": None if args.model else args.preset,
                        "model_bytes": model.stat().st_size, "vocab": vocab, "seq": args.seq,
                        "threads": args.threads, "batches": args.batch_list, "rounds": args.rounds,
                        "seconds": args.seconds, "min_runs": args.min_runs, "warmup": args.warmup,
                        "calibration_samples": args.calibration, "ov_precision": args.ov_precision,
                        "skipped": args.skip_list,
                        "lengths_from": args.lengths_from, "tokenizer": args.tokenizer,
                        "lengths": {str(b): v for b, v in args.lengths.items()} or None,
                        "ort_session": {"intra_op_num_threads": args.threads, "inter_op_num_threads": 1,
                                        "graph_optimization_level": "ORT_ENABLE_ALL",
                                        "execution_mode": "ORT_SEQUENTIAL"},
                        "roofline_macs_per_token": (
                            f"{facts['linear_macs_per_token']} (weight products) + {facts['layers']} layers "
                            f"x 2 x seq x {facts['hidden']} (attention)"),
                    },
                    "engines": {e.name: {"info": e.info, "error": e.error} for e in engines},
                    "int8_peak": peak,
                    "int8_peak_error": peak_error,
                    "summary": summary,
                    "measurements": {str(b): v for b, v in rows.items()},
                }
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
                log(f"wrote {args.out}")
    except BenchError as e:
        print(f"{benchlib.PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{benchlib.PROG}: interrupted", file=sys.stderr)
        return 1
    if failures:
        print(f"{benchlib.PROG}: {len(failures)} failure(s): " + "; ".join(f.splitlines()[0] for f in failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
