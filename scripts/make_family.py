#!/usr/bin/env python3
"""Random-weight ONNX exports of the BERT family, for encore's import, FP32 and INT8 tests.

Every architecture is built from PyPI `transformers` with a small config and fixed seeds (nothing
comes from a model hub), then exported

  - with the TorchScript exporter (`torch.onnx.export(..., dynamo=False)`, opset 17), and
  - with the dynamo exporter (`torch.onnx.export(..., dynamo=True)`, its default opset: 20),

each with Hugging Face's eager attention and, where the class has it, SDPA
(`attn_implementation="sdpa"`). Inputs are `input_ids` and `attention_mask` (and
`token_type_ids` where the model takes them), int64 `[batch, sequence]` with both axes dynamic;
the output is `last_hidden_state`.

Beside each `model.onnx` go reference batches (right-padded, so real and padded positions differ)
and onnxruntime's outputs on them as `.npy`, and `manifest.json` indexes it all (file,
architecture, exporter, attention, opset, inputs, outputs, op histogram, sha256, onnxruntime
against PyTorch). An export that fails is listed under `not_exported` with its error, so the table
says why a variant is missing.

Small versions (what `tests/models/family/` holds; `crates/runtime/tests/family_models.rs` reads
them):

    python3.11 -m venv .venv-family
    .venv-family/bin/pip install -r scripts/requirements-family.txt
    .venv-family/bin/python scripts/make_family.py            # writes tests/models/family/

Base sizes (the published shapes of bert-base-uncased, roberta-base, xlm-roberta-base,
distilbert-base-uncased, electra-base-discriminator, albert-base-v2, mpnet-base /
all-mpnet-base-v2, deberta-v3-base and ModernBERT-base, random weights; 0.04-1.1 GB each, not
committed):

    .venv-family/bin/python scripts/make_family.py --base --out /tmp/family-base \\
        [--arch bert,mpnet] [--exporter torchscript] [--attention eager]

The exports are deterministic for the pinned versions: the same seeds give the same weights, and
the eager and SDPA variants of one architecture share them.
"""

import argparse
import hashlib
import json
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers

OPSET_TORCHSCRIPT = 17
# The dynamo exporter is left at its default opset (20 in torch 2.9, converted from torchlib's
# 18), which is what its users get.

# (name, per-row real lengths, padded length). b1 has a one-token row, b2 rows longer than the
# tiny ModernBERT's local attention window (so local and global attention differ).
BATCHES = [
    ("b0", [8, 5], 8),
    ("b1", [17, 9, 4, 1], 17),
    ("b2", [40, 23], 40),
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------
# Architectures: tiny and base configs
# --------------------------------------------------------------------------
# tok: special ids the reference batches use (cls, sep, pad; body ids from first_id up).
BERT_TOK = dict(cls_id=2, sep_id=3, pad_id=0, first_id=5)
ROBERTA_TOK = dict(cls_id=0, sep_id=2, pad_id=1, first_id=4)
DEBERTA_TOK = dict(cls_id=1, sep_id=2, pad_id=0, first_id=4)

# Tiny shapes share: 2 layers, hidden 64, FFN 128, vocab 256 (30 exports stay under 15 MB). Heads vary (2 or 4, head dim 32
# or 16) so both head sizes are exercised.
TINY = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
            initializer_range=0.1)


def arch_specs(base):
    """name -> dict(cls, config_cls, tiny kwargs, base kwargs, token types?, tok ids, seed)."""
    T = transformers
    specs = {
        "bert": dict(
            model="BertModel", config="BertConfig", types=True, tok=BERT_TOK, seed=11,
            model_kwargs=dict(add_pooling_layer=False),
            tiny=dict(**TINY, num_attention_heads=4, max_position_embeddings=64,
                      type_vocab_size=2, pad_token_id=0),
            base=dict(),  # bert-base-uncased is BertConfig's default
        ),
        "roberta": dict(
            model="RobertaModel", config="RobertaConfig", types=False, tok=ROBERTA_TOK, seed=12,
            model_kwargs=dict(add_pooling_layer=False),
            tiny=dict(**TINY, num_attention_heads=2, max_position_embeddings=66,
                      type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
                      eos_token_id=2),
            base=dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                      layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        ),
        "xlm-roberta": dict(
            model="XLMRobertaModel", config="XLMRobertaConfig", types=False, tok=ROBERTA_TOK,
            seed=13, model_kwargs=dict(add_pooling_layer=False),
            tiny=dict(**TINY, num_attention_heads=4, max_position_embeddings=66,
                      type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
                      eos_token_id=2),
            base=dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
                      layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        ),
        "distilbert": dict(
            model="DistilBertModel", config="DistilBertConfig", types=False, tok=BERT_TOK,
            seed=14, model_kwargs={},
            tiny=dict(vocab_size=256, dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                      max_position_embeddings=64, initializer_range=0.1, pad_token_id=0),
            base=dict(),
        ),
        "electra": dict(
            # ELECTRA's embeddings are narrower than its layers (a projection between them).
            model="ElectraModel", config="ElectraConfig", types=True, tok=BERT_TOK, seed=15,
            model_kwargs={},
            tiny=dict(**TINY, embedding_size=32, num_attention_heads=4,
                      max_position_embeddings=64, type_vocab_size=2, pad_token_id=0),
            base=dict(embedding_size=768, hidden_size=768, num_attention_heads=12,
                      intermediate_size=3072),
        ),
        "albert": dict(
            # One set of layer weights shared by every layer, factorized embeddings, and the
            # tanh GELU ("gelu_new"), as albert-base-v2 has.
            model="AlbertModel", config="AlbertConfig", types=True, tok=BERT_TOK, seed=16,
            model_kwargs=dict(add_pooling_layer=False),
            tiny=dict(**TINY, embedding_size=32, num_attention_heads=2,
                      max_position_embeddings=64, type_vocab_size=2, pad_token_id=0),
            base=dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072),
        ),
        "mpnet": dict(
            # Relative position buckets added to the attention scores (all-mpnet-base-v2).
            model="MPNetModel", config="MPNetConfig", types=False, tok=ROBERTA_TOK, seed=17,
            model_kwargs=dict(add_pooling_layer=False),
            tiny=dict(**TINY, num_attention_heads=4, max_position_embeddings=66,
                      relative_attention_num_buckets=32, layer_norm_eps=1e-5, pad_token_id=1,
                      bos_token_id=0, eos_token_id=2),
            base=dict(vocab_size=30527, max_position_embeddings=514, layer_norm_eps=1e-5),
        ),
        "deberta-v2": dict(
            # DeBERTa-v3's settings: disentangled attention (c2p, p2c) over log-bucketed
            # relative positions, no absolute positions, no token types.
            model="DebertaV2Model", config="DebertaV2Config", types=False, tok=DEBERTA_TOK,
            seed=18, model_kwargs={},
            tiny=dict(**TINY, num_attention_heads=2, max_position_embeddings=64,
                      type_vocab_size=0, relative_attention=True, position_buckets=16,
                      max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                      norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                      layer_norm_eps=1e-7, pad_token_id=0),
            base=dict(vocab_size=128100, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072, type_vocab_size=0,
                      relative_attention=True, position_buckets=256, max_relative_positions=-1,
                      pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                      position_biased_input=False, layer_norm_eps=1e-7, pad_token_id=0),
        ),
        "modernbert": dict(
            # Rotary positions, GeGLU, no biases, pre-norm, alternating global and sliding-window
            # (local) attention: layer 0 global, layer 1 local with a 16-token window.
            model="ModernBertModel", config="ModernBertConfig", types=False, tok=DEBERTA_TOK,
            seed=19, model_kwargs={},
            tiny=dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                      num_attention_heads=4, max_position_embeddings=128,
                      global_attn_every_n_layers=2, local_attention=16, initializer_range=0.1,
                      pad_token_id=0, cls_token_id=1, bos_token_id=1, sep_token_id=2,
                      eos_token_id=2, reference_compile=False),
            base=dict(vocab_size=50368, hidden_size=768, intermediate_size=1152,
                      num_hidden_layers=22, num_attention_heads=12, reference_compile=False),
        ),
    }
    for s in specs.values():
        s["model_cls"] = getattr(T, s["model"])
        s["config_cls"] = getattr(T, s["config"])
        s["kwargs"] = s["base"] if base else s["tiny"]
    return specs


def perturb_params(model, seed):
    """Give biases and norm parameters non-trivial values (HF init sets them to 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            lname = name.lower()
            if "norm" in lname:
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def build_model(spec, attn):
    """The architecture with `attn` attention, or the reason it has none (ValueError from HF)."""
    cfg = spec["config_cls"](**spec["kwargs"], attn_implementation=attn)
    torch.manual_seed(spec["seed"])
    model = spec["model_cls"](cfg, **spec["model_kwargs"]).eval()
    perturb_params(model, spec["seed"] + 1000)
    if model.config._attn_implementation != attn:
        raise ValueError(f"asked for {attn} attention, got {model.config._attn_implementation}")
    return model, cfg


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------
def random_batch(rng, lengths, seq, vocab, tok, with_types):
    """input_ids / attention_mask (/ token_type_ids), right-padded with pad_id."""
    b = len(lengths)
    ids = np.full((b, seq), tok["pad_id"], dtype=np.int64)
    mask = np.zeros((b, seq), dtype=np.int64)
    types = np.zeros((b, seq), dtype=np.int64)
    for i, n in enumerate(lengths):
        body = rng.integers(tok["first_id"], vocab, size=n, dtype=np.int64)
        body[0] = tok["cls_id"]
        if n >= 2:
            body[n - 1] = tok["sep_id"]
        ids[i, :n] = body
        mask[i, :n] = 1
        if with_types and n >= 4 and i % 2 == 1:
            half = n // 2
            ids[i, half - 1] = tok["sep_id"]
            types[i, half:n] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if with_types:
        feeds["token_type_ids"] = types
    return feeds


class Encoder(torch.nn.Module):
    """forward(input_ids, attention_mask) -> last_hidden_state: named positional tensors, which
    both exporters take (torch.export mishandles a `*args` forward's guards)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          return_dict=True)["last_hidden_state"]


class EncoderWithTypes(Encoder):
    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids, return_dict=True)["last_hidden_state"]


def wrap(model, input_names):
    return (EncoderWithTypes if "token_type_ids" in input_names else Encoder)(model).eval()


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------
def export(model, path, input_names, exporter, dummy):
    wrapper = wrap(model, input_names)
    args = tuple(torch.from_numpy(dummy[n]) for n in input_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if exporter == "torchscript":
            dyn = {n: {0: "batch", 1: "sequence"} for n in input_names}
            dyn["last_hidden_state"] = {0: "batch", 1: "sequence"}
            torch.onnx.export(
                wrapper, args, str(path), input_names=input_names,
                output_names=["last_hidden_state"], dynamic_axes=dyn,
                opset_version=OPSET_TORCHSCRIPT, do_constant_folding=True, dynamo=False)
        else:
            # Names (not Dim objects) are taken as Dim.DYNAMIC: the guards torch.export adds
            # for size 1 (broadcasting) do not fail the export, and the ONNX axes keep the names.
            shapes = {n: {0: "batch", 1: "sequence"} for n in input_names}
            prog = torch.onnx.export(
                wrapper, args, input_names=input_names, output_names=["last_hidden_state"],
                dynamic_shapes=shapes, dynamo=True,
                external_data=False, optimize=True, verbose=False)
            prog.save(str(path), external_data=False)
    m = onnx.load(str(path))
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    onnx.checker.check_model(m)
    # The dynamo exporter annotates every node and value with its Python stack trace, FX node
    # and module path (a quarter of a tiny model's bytes): provenance only, so it goes.
    for x in [*m.graph.node, *m.graph.value_info, *m.graph.input, *m.graph.output,
              *m.graph.initializer]:
        del x.metadata_props[:]
    m.doc_string = (f"Exported by scripts/make_family.py (torch {torch.__version__}, "
                    f"transformers {transformers.__version__}, {exporter} exporter)")
    onnx.save(m, str(path))
    return opset


def io_signature(m):
    init = {i.name for i in m.graph.initializer}

    def sig(vi):
        t = vi.type.tensor_type
        return {
            "name": vi.name,
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
            "shape": [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim],
        }

    return ([sig(i) for i in m.graph.input if i.name not in init],
            [sig(o) for o in m.graph.output])


def op_histogram(m):
    hist = {}
    for n in m.graph.node:
        k = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        hist[k] = hist.get(k, 0) + 1
    return dict(sorted(hist.items()))


def ort_session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def masked_max_abs(a, b, mask):
    """Max |a - b| over the real (mask 1) positions of [B, S, ...] tensors."""
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(d[mask.astype(bool)].max())


def rel(path, out):
    return str(path.relative_to(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent.parent / "tests/models/family")
    ap.add_argument("--base", action="store_true",
                    help="published base sizes instead of the tiny test shapes (not committed)")
    ap.add_argument("--arch", default="", help="comma-separated subset, e.g. bert,mpnet")
    ap.add_argument("--exporter", default="torchscript,dynamo")
    ap.add_argument("--attention", default="eager,sdpa")
    args = ap.parse_args()

    torch.set_num_threads(2)
    specs = arch_specs(args.base)
    archs = [a for a in args.arch.split(",") if a] or list(specs)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    models, not_exported = [], []
    for arch in archs:
        spec = specs[arch]
        input_names = ["input_ids", "attention_mask"] + (["token_type_ids"] if spec["types"] else [])
        for attn in args.attention.split(","):
            try:
                model, cfg = build_model(spec, attn)
            except (ValueError, ImportError) as e:
                log(f"{arch} {attn}: no such attention: {e}")
                for exporter in args.exporter.split(","):
                    not_exported.append(dict(
                        id=f"{arch}-{exporter}-{attn}", architecture=spec["model"],
                        exporter=exporter, attention=attn,
                        reason=f"{spec['model']} has no {attn} attention in transformers "
                               f"{transformers.__version__}: {str(e).splitlines()[0]}"))
                continue
            vocab = cfg.vocab_size
            rng = np.random.default_rng(spec["seed"])
            batches = [(name, random_batch(rng, lengths, seq, vocab, spec["tok"], spec["types"]))
                       for name, lengths, seq in BATCHES]
            with torch.no_grad():
                wrapper = wrap(model, input_names)
                torch_out = {name: wrapper(*[torch.from_numpy(f[n]) for n in input_names]).numpy()
                             for name, f in batches}
            for exporter in args.exporter.split(","):
                mid = f"{arch}-{exporter}-{attn}"
                d = out / mid
                path = d / "model.onnx"
                log(f"{mid}: exporting")
                try:
                    opset = export(model, path, input_names, exporter, batches[0][1])
                    sess = ort_session(path)
                except Exception as e:  # noqa: BLE001 - the reason goes into the manifest
                    msg = "".join(traceback.format_exception_only(type(e), e)).strip()
                    log(f"{mid}: export failed: {msg[:2000]}")
                    not_exported.append(dict(
                        id=mid, architecture=spec["model"], exporter=exporter, attention=attn,
                        reason=msg.splitlines()[-1][:500] if msg else type(e).__name__))
                    if path.exists():
                        path.unlink()
                    continue
                m = onnx.load(str(path))
                ins, outs = io_signature(m)
                refs, ort_vs_torch = [], {}
                for name, feeds in batches:
                    got = sess.run(None, {n: feeds[n] for n in input_names})[0]
                    ort_vs_torch[name] = masked_max_abs(got, torch_out[name],
                                                        feeds["attention_mask"])
                    entry = {"name": name, "inputs": {}, "outputs": {}}
                    for n in input_names:
                        p = d / f"{name}.{n}.npy"
                        np.save(p, feeds[n])
                        entry["inputs"][n] = {"file": rel(p, out), "dtype": "int64",
                                              "shape": list(feeds[n].shape)}
                    p = d / f"{name}.last_hidden_state.npy"
                    np.save(p, got.astype(np.float32))
                    entry["outputs"]["last_hidden_state"] = {
                        "file": rel(p, out), "dtype": "float32", "shape": list(got.shape)}
                    refs.append(entry)
                worst = max(ort_vs_torch.values())
                log(f"{mid}: onnxruntime vs torch at real positions {worst:.3e}")
                models.append(dict(
                    id=mid, file=rel(path, out), architecture=spec["model"], exporter=exporter,
                    attention=attn, opset=opset, seed=spec["seed"],
                    config={k: v for k, v in spec["kwargs"].items()},
                    special_ids=spec["tok"], inputs=ins, outputs=outs, ops=op_histogram(m),
                    bytes=path.stat().st_size, sha256=sha256_file(path),
                    ort_vs_torch_max_abs=ort_vs_torch, references=refs))
                (d / "config.json").write_text(cfg.to_json_string())

    manifest = dict(
        format_version=1,
        generated_by="scripts/make_family.py" + (" --base" if args.base else ""),
        tools={"python": sys.version.split()[0], "torch": torch.__version__,
               "transformers": transformers.__version__, "onnx": onnx.__version__,
               "onnxruntime": ort.__version__,
               "onnxscript": __import__("onnxscript").__version__, "numpy": np.__version__},
        batches=[dict(name=n, lengths=l, sequence=s) for n, l, s in BATCHES],
        models=models, not_exported=not_exported)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"{len(models)} models, {len(not_exported)} not exported, {total / 1e6:.2f} MB in {out}")


if __name__ == "__main__":
    main()
