#!/usr/bin/env python3
"""End-to-end speed of the encoder family beside its peers: one table and one PNG chart.

For each model shape (default: BERT-base, DistilBERT-base and XLM-RoBERTa-base, from
`encore build-model --preset`), runs scripts/bench_int8.py (its own venv with onnxruntime,
OpenVINO and NNCF; encore FP32, INT8 dynamic and static, onnxruntime FP32 and INT8, OpenVINO INT8
quantized by NNCF, interleaved rounds in one run) at sequence 128 for batches 1, 8 and 32, and at
sequence 384 for batch 1. Then writes:

  OUT/PRESET-s128.json, OUT/PRESET-s384.json   bench_int8.py's full results
  OUT/speed.md                                  the table: seq/s, throughput and p50 ratios to
                                                OpenVINO INT8, fraction of the `vpdpbusd`
                                                roofline, the runtime issue's goal per row
  OUT/speed.png                                 the same as grouped bars

    python3 scripts/bench_models.py --out bench-results [--presets bert-base,distilbert-base]
        [--rounds 2] [--seconds 3] [--threads 2] [--workdir DIR] [--encore-bin PATH] [--chart-only]

`--chart-only` redraws the table and the chart from the JSON files already in OUT.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_PY = REPO / ".venv-int8-bench" / "bin" / "python"
ENGINES = ["encore-fp32", "encore-int8", "encore-int8-static", "encore-int8-static-attn", "ort-fp32",
           "ort-int8-dynamic", "openvino-int8-nncf"]
RUNS = [("s128", 128, "1,8,32"), ("s384", 384, "1")]
PEER = "openvino-int8-nncf"


def run_benches(args: argparse.Namespace, out: Path) -> None:
    for preset in args.presets.split(","):
        for tag, seq, batches in RUNS:
            cmd = [sys.executable, str(REPO / "scripts" / "bench_int8.py"), "--preset", preset,
                   "--seq", str(seq), "--batches", batches, "--threads", str(args.threads),
                   "--rounds", str(args.rounds), "--seconds", str(args.seconds), "--min-runs", "3",
                   "--skip", "openvino-fp32", "--out", str(out / f"{preset}-{tag}.json")]
            if args.workdir:
                cmd += ["--workdir", str(Path(args.workdir) / preset)]
            if args.encore_bin:
                cmd += ["--encore-bin", args.encore_bin]
            print("+", " ".join(cmd), flush=True)
            # A failed engine makes bench_int8 exit 1 after writing its JSON: keep going.
            subprocess.run(cmd, check=False)


def roofline_fraction(engine: dict | None) -> float | None:
    """An engine's GEMM work over its time as a fraction of the `vpdpbusd` peak: the runtime
    issue's roofline on every CPU. bench_int8.py gives `fraction_of_vnni_peak` where the int8 peak
    it measured is the tile unit's (AMX); elsewhere its int8 peak is `vpdpbusd`'s."""
    if not engine:
        return None
    return engine.get("fraction_of_vnni_peak", engine.get("fraction_of_int8_peak"))


def load_rows(out: Path, presets: list[str]) -> tuple[list[dict], dict | None]:
    rows, machine = [], None
    for preset in presets:
        for tag, seq, _ in RUNS:
            f = out / f"{preset}-{tag}.json"
            if not f.exists():
                continue
            data = json.loads(f.read_text())
            machine = machine or data.get("machine")
            for s in data["summary"]:
                engines = s["engines"]
                best = best_int8(engines)
                peer = engines.get(PEER)
                rows.append({
                    "model": preset, "seq": seq, "batch": s["batch"],
                    "seq_per_s": {k: v["seq_per_s"] for k, v in engines.items()},
                    "best_int8": best,
                    "p50_ratio": p50_ratio(engines, peer),
                    "roofline": (roofline_fraction(engines.get(best)) if best else None,
                                 roofline_fraction(peer)),
                    "goal": s.get("goal"),
                })
    return rows, machine


def best_int8(engines: dict) -> str | None:
    """The fastest of encore's INT8 engines in a row (the goal's `best_engine` picks the same)."""
    ours = [e for e in ("encore-int8", "encore-int8-static", "encore-int8-static-attn")
            if (engines.get(e) or {}).get("seq_per_s")]
    return max(ours, key=lambda e: engines[e]["seq_per_s"]) if ours else None


def p50_ratio(engines: dict, peer: dict | None) -> float | None:
    """The lowest p50 of encore's INT8 engines over the peer's (the latency goal's ratio)."""
    p50 = [v["p50_ms"] for e, v in engines.items() if e.startswith("encore-int8") and v.get("p50_ms")]
    return min(p50) / peer["p50_ms"] if p50 and peer and peer.get("p50_ms") else None


def goal_cell(goal: dict | None) -> str:
    """The runtime issue's goal of a row as bench_int8.py judged it: batch-1 p50 latency at most
    0.8x OpenVINO INT8's, larger batches' throughput at least 1.25x."""
    if not goal:
        return "-"
    verdict = "met" if goal["met"] else "NOT met"
    if goal["kind"] == "latency":
        return f"p50 {goal['best_ratio']:.2f}x <= {goal['ratio']:g}x: {verdict}"
    return f"{goal['best_ratio']:.2f}x >= {goal['ratio']:g}x: {verdict}"


def pct(x: float | None) -> str:
    return f"{100 * x:.0f} %" if x else "-"


def write_table(rows: list[dict], machine: dict | None, path: Path) -> None:
    cpu = (machine or {}).get("cpu", {}).get("model", "unknown CPU")
    caps = (machine or {}).get("isa_caps") or {}
    head = f"CPU: {cpu}"
    if caps:
        head += " (instruction sets capped: " + ", ".join(f"{k}={v}" for k, v in caps.items()) + ")"
    lines = [head + "; seq/s, median of the interleaved rounds; ratios in the same run. \"best "
             "encore INT8\" is the fastest of encore's INT8 engines in the row; the roofline is "
             "the forward's GEMM MACs over its time at the measured `vpdpbusd` peak (the runtime "
             "issue's goal: >= 80 % for encore).", "",
             "| model | seq | batch | " + " | ".join(ENGINES) + " | best encore INT8 / OpenVINO INT8 "
             "| p50 encore INT8 / OpenVINO INT8 | best encore INT8 / encore FP32 "
             "| roofline, best encore INT8 / OpenVINO INT8 | goal |",
             "|" + "---|" * (len(ENGINES) + 8)]
    for r in rows:
        e = r["seq_per_s"]
        best = e.get(r["best_int8"]) if r["best_int8"] else None
        ov, f32 = e.get(PEER), e.get("encore-fp32")
        cells = [f"{e[k]:.2f}" if e.get(k) else "-" for k in ENGINES]
        cells.append(f"{best / ov:.2f}x" if best and ov else "-")
        cells.append(f"{r['p50_ratio']:.2f}x" if r["p50_ratio"] else "-")
        cells.append(f"{best / f32:.2f}x" if best and f32 else "-")
        ours, peer = r["roofline"]
        cells.append(f"{pct(ours)} / {pct(peer)}")
        cells.append(goal_cell(r["goal"]))
        lines.append(f"| {r['model']} | {r['seq']} | {r['batch']} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


def write_chart(rows: list[dict], machine: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\nseq {r['seq']}, batch {r['batch']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(rows)), 5.5))
    width = 0.8 / len(ENGINES)
    for i, eng in enumerate(ENGINES):
        # Each bar is that engine's throughput over OpenVINO INT8's in the same run.
        vals = []
        for r in rows:
            ov = r["seq_per_s"].get("openvino-int8-nncf")
            v = r["seq_per_s"].get(eng)
            vals.append(v / ov if v and ov else 0.0)
        ax.bar([x + (i - len(ENGINES) / 2 + 0.5) * width for x in range(len(rows))], vals, width, label=eng)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.25, color="gray", linewidth=0.8, linestyle="--", label="throughput goal (1.25x)")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("throughput / OpenVINO INT8 (same run)")
    cpu = (machine or {}).get("cpu", {}).get("model", "unknown CPU")
    ax.set_title(f"Encoder throughput relative to OpenVINO INT8 (NNCF), {cpu}")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench-results")
    p.add_argument("--presets", default="bert-base,distilbert-base,xlm-roberta-base")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir")
    p.add_argument("--encore-bin")
    p.add_argument("--chart-only", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.chart_only:
        run_benches(args, out)
    rows, machine = load_rows(out, args.presets.split(","))
    if not rows:
        print(f"no results in {out}", file=sys.stderr)
        return 1
    write_table(rows, machine, out / "speed.md")
    try:
        write_chart(rows, machine, out / "speed.png")
    except ImportError:
        # The chart needs matplotlib: bench_int8.py's venv has it.
        if VENV_PY.exists() and Path(sys.prefix).resolve() != VENV_PY.parent.parent.resolve():
            return subprocess.run([str(VENV_PY), __file__, "--chart-only", "--out", str(out),
                                   "--presets", args.presets]).returncode
        print("matplotlib is missing: pip install matplotlib, then --chart-only", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
