#!/usr/bin/env python3
"""Runs ONNX backend node tests (the `onnx/backend/test/data/node` folder of an onnx wheel that
still ships it, e.g. onnx 1.22.0) through the encore CLI and compares the outputs.

Each case is a `model.onnx` with `test_data_set_*/input_*.pb` and `output_*.pb`. The inputs are
written as .npy (FLOAT16, BFLOAT16 and DOUBLE widened to f32, as encore imports them) and given
to `encore run --model M --input NAME=FILE --output-dir DIR`; every output is compared with the
reference: floats within |got - want| <= atol + rtol * |want| (rtol 1e-3, atol 1e-5; NaN where
NaN), everything else exactly. A case is

  pass     all outputs match,
  wrong    an output differs (value, shape or count),
  crash    encore died on a signal, panicked, or ran past the timeout,
  refused  encore exited with an error message (a typed refusal), or the case's data are not
           tensors (sequences, optionals), which encore does not take.

Usage (from the repository root, after `cargo build --release`; any onnx and numpy will read the
data, e.g. the CI venv's onnx 1.23.2):

  .venv-ci/bin/python scripts/onnx_node_tests.py --fetch 1.22.0 --filter 'gathernd|pad|round'
  .venv-ci/bin/python scripts/onnx_node_tests.py --fetch 1.22.0 --expect tests/onnx_node_pass.txt

`--fetch VERSION` downloads that onnx wheel once (`pip download --no-deps`, the interpreter's own
platform) and unpacks only its `onnx/backend/test/data/node` into `.cache/onnx-VERSION-node`
(ignored by git); later runs read the cache. `--data DIR` names a node folder directly.

It prints one line per case that is not a pass (with `--verbose`, every case), then a table
per op and the totals. The exit status is 1 when any case is wrong or crashed. With `--expect
FILE` (one case name per line, `test_` prefix removed, `#` comments) it is also 1 when a listed
case does not pass, or when a case passes that the file does not list: the list is the ratchet
of what passes, so a new pass must be added to it (`--write-expect FILE` rewrites it from the
run; review the diff).
"""

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np
import onnx
from onnx import numpy_helper

WIDEN = {np.float16: np.float32, np.float64: np.float32}


def node_dir() -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")


def fetch_node_data(version: str, cache_root: str) -> str:
    """The node test folder of onnx `version`, downloaded and unpacked into the cache once."""
    dest = os.path.join(cache_root, f"onnx-{version}-node")
    node = os.path.join(dest, "onnx", "backend", "test", "data", "node")
    done = os.path.join(dest, ".complete")
    if os.path.exists(done):
        return node
    wheels = os.path.join(cache_root, "wheels")
    os.makedirs(wheels, exist_ok=True)
    pattern = os.path.join(wheels, f"onnx-{version}-*.whl")
    if not glob.glob(pattern):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
             "--no-deps", "--only-binary=:all:", f"onnx=={version}", "-d", wheels],
            check=True)
    wheel = sorted(glob.glob(pattern))[0]
    prefix = "onnx/backend/test/data/node/"
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith(prefix)]
        if not members:
            sys.exit(f"{wheel} holds no {prefix} (onnx 1.23 and later do not ship it)")
        z.extractall(dest, members)
    open(done, "w").close()
    return node


def read_case_list(path: str) -> list:
    with open(path) as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return [line for line in lines if line]


def load_pb(path: str):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t.name, numpy_helper.to_array(t)


def numbered(folder: str, kind: str) -> list:
    """`folder/kind_0.pb`, `kind_1.pb`, … in index order."""
    paths = glob.glob(os.path.join(folder, f"{kind}_*.pb"))
    return sorted(paths, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))


def as_encore_input(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.float16 or a.dtype == np.float64 or str(a.dtype) == "bfloat16":
        return a.astype(np.float32)
    return a


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    if want.dtype.kind == "f" or str(want.dtype) == "bfloat16":
        want = want.astype(np.float32)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind == "f":
        got = got.astype(np.float32)
        nan = np.isnan(want)
        if not np.array_equal(np.isnan(got), nan):
            return "NaN positions differ"
        g, w = got[~nan], want[~nan]
        inf = np.isinf(w)
        if not np.array_equal(g[inf], w[inf]):
            return "infinities differ"
        err = np.abs(g[~inf] - w[~inf]) - (atol + rtol * np.abs(w[~inf]))
        if err.size and err.max() > 0:
            return f"max excess error {err.max():.3g}"
        return ""
    if want.dtype == np.bool_:
        got = got.astype(np.bool_)
    if not np.array_equal(got.astype(want.dtype), want) or got.dtype.kind != want.dtype.kind:
        return f"values differ ({got.dtype} vs {want.dtype})"
    return ""


def run_case(encore: str, case: str, timeout: float, rtol: float, atol: float):
    model = os.path.join(case, "model.onnx")
    m = onnx.load(model, load_external_data=False)
    ops = sorted({n.op_type for n in m.graph.node}) or ["<none>"]
    inits = {t.name for t in m.graph.initializer}
    in_names = [i.name for i in m.graph.input if i.name not in inits]
    out_names = [o.name for o in m.graph.output]
    op = "+".join(ops) if len(ops) <= 2 else ops[0] + "+…"
    sets = sorted(glob.glob(os.path.join(case, "test_data_set_*")))
    for ds in sets:
        with tempfile.TemporaryDirectory() as tmp:
            args = [encore, "run", "--model", model, "--output-dir", tmp, "--threads", "1"]
            for i, p in enumerate(numbered(ds, "input")):
                f = os.path.join(tmp, f"in{i}.npy")
                try:
                    name, a = load_pb(p)
                    name = name or in_names[i]
                    np.save(f, as_encore_input(a))
                except Exception as e:  # noqa: BLE001 - sequences, optionals, strings
                    return op, "refused", f"input {i} is not a tensor encore reads: {e}"
                args += ["--input", f"{name}={f}"]
            try:
                r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return op, "crash", "timeout"
            msg = (r.stderr or r.stdout).strip().splitlines()
            msg = msg[-1] if msg else ""
            if r.returncode < 0 or "panicked" in r.stderr:
                return op, "crash", msg or f"signal {-r.returncode}"
            if r.returncode != 0:
                return op, "refused", msg
            for i, p in enumerate(numbered(ds, "output")):
                try:
                    name, want = load_pb(p)
                except Exception as e:  # noqa: BLE001 - sequences, optionals
                    return op, "refused", f"output {i} is not a tensor: {e}"
                name = name or out_names[i]
                f = os.path.join(tmp, f"{name}.npy")
                if not os.path.exists(f):
                    return op, "wrong", f"no output {name}"
                why = compare(np.load(f), want, rtol, atol)
                if why:
                    return op, "wrong", f"{name}: {why}"
    return op, "pass", ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encore", default="target/release/encore")
    ap.add_argument("--data", default=None, help="the node test folder (default: the onnx wheel's)")
    ap.add_argument("--fetch", metavar="VERSION", default=None,
                    help="download onnx VERSION's node tests into --cache and use them")
    ap.add_argument("--cache", default=".cache", help="where --fetch keeps the data")
    ap.add_argument("--expect", metavar="FILE", default=None,
                    help="the cases that must pass, and no others (exit 1 otherwise)")
    ap.add_argument("--write-expect", metavar="FILE", default=None,
                    help="write the passing cases to FILE")
    ap.add_argument("--filter", default="", help="regex on the case name (test_ prefix removed)")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    data = args.data or (fetch_node_data(args.fetch, args.cache) if args.fetch else node_dir())
    cases = sorted(glob.glob(os.path.join(data, "test_*")))
    if not cases:
        sys.exit(f"no node test cases in {data}")
    start = time.monotonic()
    passed = []
    rx = re.compile(args.filter)
    per_op = collections.defaultdict(collections.Counter)
    totals = collections.Counter()
    for case in cases:
        name = os.path.basename(case)[len("test_"):]
        if not rx.search(name):
            continue
        op, verdict, why = run_case(args.encore, case, args.timeout, args.rtol, args.atol)
        per_op[op][verdict] += 1
        totals[verdict] += 1
        if verdict == "pass":
            passed.append(name)
        if verdict != "pass" or args.verbose:
            print(f"{verdict:8} {name}: {why}")
    print(f"\n{'op':40} {'pass':>5} {'wrong':>5} {'crash':>5} {'refused':>7}")
    for op in sorted(per_op):
        c = per_op[op]
        print(f"{op:40} {c['pass']:5} {c['wrong']:5} {c['crash']:5} {c['refused']:7}")
    print(f"{'total':40} {totals['pass']:5} {totals['wrong']:5} {totals['crash']:5} "
          f"{totals['refused']:7}")
    print(f"{sum(totals.values())} of the {len(cases)} cases in {data}, "
          f"{time.monotonic() - start:.1f} s")
    failed = bool(totals["wrong"] or totals["crash"])
    if failed:
        print(f"FAIL: {totals['wrong']} wrong, {totals['crash']} crashed (both must be 0)")
    if args.write_expect:
        with open(args.write_expect, "w") as f:
            f.write("# ONNX backend node tests (onnx 1.22.0) that encore passes; checked by\n"
                    "# scripts/onnx_node_tests.py --expect (CI). One case a line, test_ removed.\n")
            f.writelines(f"{name}\n" for name in passed)
        print(f"wrote {len(passed)} passing cases to {args.write_expect}")
    if args.expect:
        # Under --filter only the listed cases that the filter selects are checked.
        expected = [c for c in read_case_list(args.expect) if rx.search(c)]
        ran = {os.path.basename(c)[len("test_"):] for c in cases}
        lost = [c for c in expected if c not in passed]
        new = sorted(set(passed) - set(expected))
        for c in lost:
            why = "no longer passes" if c in ran else "is not in the data (renamed?)"
            print(f"REGRESSION {c}: listed in {args.expect}, {why}")
        for c in new:
            print(f"NEW PASS   {c}: passes, not listed in {args.expect}")
        if lost:
            print(f"FAIL: {len(lost)} listed cases do not pass")
        if new:
            print(f"FAIL: {len(new)} cases pass that {args.expect} does not list; add them "
                  f"(scripts/onnx_node_tests.py --fetch 1.22.0 --write-expect {args.expect})")
        if not lost and not new:
            print(f"the {len(expected)} cases of {args.expect} pass, and no other")
        failed = failed or bool(lost or new)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
