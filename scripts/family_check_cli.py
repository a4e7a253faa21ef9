#!/usr/bin/env python3
"""Runs every model of a make_family.py manifest through `encore run` (the default session:
declutter, fuse, padding-free) and prints its largest error against the onnxruntime reference
outputs at real (mask 1) positions. For the base-size exports, which the Rust tests do not hold
(`crates/runtime/tests/family_models.rs` checks the small ones in-process):

    .venv-family/bin/python scripts/make_family.py --base --out /tmp/family-base --arch bert
    cargo build --release --bin encore
    .venv-family/bin/python scripts/family_check_cli.py /tmp/family-base [--encore target/release/encore]

Exits 1 when a model is refused, fails, or is off by more than --tol (1e-4).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="a folder with make_family.py's manifest.json")
    ap.add_argument("--encore", default="target/release/encore")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    man = json.loads((args.dir / "manifest.json").read_text())
    bad = 0
    for m in man["models"]:
        worst, err, t0 = 0.0, None, time.time()
        for r in m["references"]:
            with tempfile.TemporaryDirectory() as out:
                cmd = [args.encore, "run", "--model", str(args.dir / m["file"])]
                for name, spec in r["inputs"].items():
                    cmd += ["--input", f"{name}={args.dir / spec['file']}"]
                cmd += ["--output-dir", out]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    err = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
                    break
                for name, spec in r["outputs"].items():
                    got = np.load(Path(out) / f"{name}.npy")
                    want = np.load(args.dir / spec["file"])
                    mask = np.load(args.dir / r["inputs"]["attention_mask"]["file"]).astype(bool)
                    worst = max(worst, float(np.abs(got - want)[mask].max()))
        took = time.time() - t0
        if err is not None or worst > args.tol:
            bad += 1
        status = err if err is not None else f"max abs {worst:.2e} at real positions"
        print(f"{m['id']:32s} {status}  ({len(m['references'])} batches, {took:.1f} s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
