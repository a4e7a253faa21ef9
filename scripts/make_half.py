#!/usr/bin/env python3
"""Half-precision twins of family exports, with onnxruntime's outputs on them.

    python3 -m venv .venv-half
    .venv-half/bin/pip install -r scripts/requirements-half.txt
    .venv-half/bin/python scripts/make_half.py          # writes tests/models/half/

For each listed export of tests/models/family (scripts/make_family.py), writes
`<id>.f16.onnx`: the same graph as a `model.half()` export holds it (FLOAT16 initializers and
constants, `Cast(to=FLOAT)` made `Cast(to=FLOAT16)`, float16 outputs; the ids and masks stay
int64), then runs it with onnxruntime's CPU provider on the family's three reference batches and
saves what it answers, widened to f32, as `<id>.<batch>.ort_f16.npy`. It also makes the
BFLOAT16 twin of each and records what onnxruntime says of it (its CPU provider has no bfloat16
kernels for these ops, so there is no reference to compare with). `manifest.json` lists the
files, the tool versions and onnxruntime's own largest error at real positions against the FP32
export's reference, which the Rust test (crates/runtime/tests/half_precision.rs) prints beside
encore's.
"""

import argparse
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MODELS = [
    "bert-torchscript-eager",
    "distilbert-dynamo-sdpa",
    "xlm-roberta-torchscript-sdpa",
    "mpnet-dynamo-eager",
]
F16_MAX = 65504.0


def narrow_tensor(t: TensorProto, to: int) -> TensorProto:
    """A FLOAT tensor as FLOAT16 or BFLOAT16 (round to nearest; beyond the range, the largest
    finite value, as `finfo(dtype).min` masks are exported)."""
    if t.data_type != TensorProto.FLOAT:
        return t
    a = numpy_helper.to_array(t)
    if to == TensorProto.FLOAT16:
        return numpy_helper.from_array(np.clip(a, -F16_MAX, F16_MAX).astype(np.float16), t.name)
    bits = a.astype(ml_dtypes.bfloat16).view(np.uint16)
    out = helper.make_tensor(t.name, TensorProto.BFLOAT16, a.shape, [], raw=False)
    out.raw_data = bits.tobytes()
    return out


def narrow_model(m: onnx.ModelProto, to: int) -> onnx.ModelProto:
    g = m.graph
    inits = [narrow_tensor(t, to) for t in g.initializer]
    del g.initializer[:]
    g.initializer.extend(inits)
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(narrow_tensor(a.t, to))
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = to
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = to
    del g.value_info[:]
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="tests/models/family")
    ap.add_argument("--out", default="tests/models/half")
    args = ap.parse_args()
    family, out = Path(args.family), Path(args.out)
    fam = json.loads((family / "manifest.json").read_text())
    batches = [b["name"] for b in fam["batches"]]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    entries = []
    for mid in MODELS:
        src = family / mid / "model.onnx"
        f16 = out / f"{mid}.f16.onnx"
        onnx.save(narrow_model(onnx.load(src), TensorProto.FLOAT16), f16)
        sess = ort.InferenceSession(str(f16), providers=["CPUExecutionProvider"])
        worst = 0.0
        for b in batches:
            feeds = {i.name: np.load(family / mid / f"{b}.{i.name}.npy") for i in sess.get_inputs()}
            got = sess.run(None, feeds)[0]
            assert got.dtype == np.float16, got.dtype
            np.save(out / f"{mid}.{b}.ort_f16.npy", got.astype(np.float32))
            ref = np.load(family / mid / f"{b}.last_hidden_state.npy")
            real = feeds["attention_mask"].astype(bool)
            worst = max(worst, float(np.abs(got.astype(np.float32) - ref)[real].max()))
        bf16 = narrow_model(onnx.load(src), TensorProto.BFLOAT16)
        bf16_path = out / "bf16.tmp.onnx"
        onnx.save(bf16, bf16_path)
        try:
            ort.InferenceSession(str(bf16_path), providers=["CPUExecutionProvider"])
            bf16_ort = "loads"
        except Exception as e:  # noqa: BLE001 - what onnxruntime says is the record
            bf16_ort = str(e).split("\n")[0][:200]
        bf16_path.unlink()
        entries.append({
            "id": mid,
            "f16": f16.name,
            "batches": batches,
            "ort_f16_vs_fp32_max_abs": worst,
            "ort_bf16": bf16_ort,
        })
        print(f"{mid}: onnxruntime f16 vs the FP32 reference {worst:.2e}; bf16: {bf16_ort}")
    manifest = {
        "generated_by": "scripts/make_half.py",
        "family": str(family),
        "tools": {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
                  "ml_dtypes": ml_dtypes.__version__},
        "models": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
