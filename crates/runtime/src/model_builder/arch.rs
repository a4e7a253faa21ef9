//! The three encoder graphs, node for node in the order and naming of the torch exports in
//! `shared/models/tiny/*/model.onnx`.

use bytes::Bytes;
use frontend_onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, DataType, GraphProto, ModelProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};

use super::graph::{
    attr_float, attr_int, attr_ints, attr_tensor, i32_tensor, i64_tensor, raw_tensor, Emitter,
};
use super::rng::{fill_f32_le, Init};
use super::{Architecture, LayerNormForm, ModelSpec, XLMR_PAD_ID};

struct Builder<'a> {
    spec: &'a ModelSpec,
    e: Emitter,
    threads: usize,
    /// DistilBERT's `attention_mask == 0`: the exporter deduplicates it, so only layer 0 computes
    /// it and later layers reuse its output.
    distil_mask_is_zero: Option<String>,
}

/// `(1 - mask) * f32::MIN` / masked_fill value, as the exports write it.
const MASK_MIN: f32 = f32::MIN;

pub(super) fn build(spec: &ModelSpec) -> ModelProto {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut b = Builder {
        spec,
        e: Emitter::default(),
        threads,
        distil_mask_is_zero: None,
    };
    let mut outputs = vec![(
        "last_hidden_state",
        vec![dp("batch"), dp("sequence"), dv(spec.hidden)],
    )];
    match spec.arch {
        Architecture::Bert => {
            let (x, cls_index) = b.bert_embeddings();
            let mask = b.extended_mask();
            let h = b.bert_encoder(x, &mask);
            if spec.with_pooler {
                b.pooler(&h, cls_index.as_deref());
            }
        }
        Architecture::XlmRoberta => {
            let token_types = b.xlmr_token_type_buffer();
            let x = b.xlmr_embeddings(&token_types);
            let mask = b.extended_mask();
            let h = b.bert_encoder(x, &mask);
            if spec.with_pooler {
                b.pooler(&h, None);
            }
        }
        Architecture::DistilBert => {
            let x = b.distilbert_embeddings();
            b.distilbert_transformer(x);
        }
    }
    if spec.with_pooler {
        outputs.push(("pooler_output", vec![dp("batch"), dv(spec.hidden)]));
    }
    let inputs = spec
        .arch
        .input_names()
        .iter()
        .map(|name| value_info(name, DataType::Int64, vec![dp("batch"), dp("sequence")]))
        .collect();
    let graph = GraphProto {
        node: b.e.nodes,
        name: "main_graph".into(),
        initializer: b.e.initializers,
        input: inputs,
        output: outputs
            .into_iter()
            .map(|(name, dims)| value_info(name, DataType::Float, dims))
            .collect(),
        ..Default::default()
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: spec.layer_norm.opset(),
        }],
        producer_name: "encore-model-builder".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: format!(
            "random {} model: layers {}, hidden {}, heads {}, ffn {}, vocab {}, positions {}, seed {}",
            spec.arch, spec.layers, spec.hidden, spec.heads, spec.ffn, spec.vocab, spec.max_positions, spec.seed
        ),
        graph: Some(graph),
        ..Default::default()
    }
}

fn dp(name: &str) -> Dimension {
    Dimension {
        value: Some(dimension::Value::DimParam(name.into())),
        ..Default::default()
    }
}

fn dv(v: usize) -> Dimension {
    Dimension {
        value: Some(dimension::Value::DimValue(v as i64)),
        ..Default::default()
    }
}

fn value_info(name: &str, dtype: DataType, dims: Vec<Dimension>) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: dtype as i32,
                shape: Some(TensorShapeProto { dim: dims }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl Builder<'_> {
    /// A random f32 initializer. `seed_name` (the PyTorch parameter name) picks the random stream,
    /// `name` is what the initializer is called in the file (the exporter renames transposed
    /// Linear weights to `onnx::MatMul_N`).
    fn weight(&mut self, name: &str, seed_name: &str, dims: &[usize], mean: f32) -> String {
        let n = dims.iter().product();
        let init = Init::Normal {
            mean,
            std: self.spec.weight_std,
        };
        let raw = fill_f32_le(self.spec.seed, seed_name, n, init, self.threads);
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        self.e
            .initializer(raw_tensor(name, DataType::Float, &dims, Bytes::from(raw)))
    }

    fn param(&mut self, name: &str, dims: &[usize]) -> String {
        self.weight(name, name, dims, 0.0)
    }

    /// `Add(bias, MatMul(x, Wᵀ))`, the export of `nn.Linear` on a 3-D input.
    fn linear(&mut self, scope: &str, module: &str, x: &str, k: usize, n: usize) -> String {
        let w_name = self.e.anon_value_name("MatMul");
        let w = self.weight(&w_name, &format!("{module}.weight"), &[k, n], 0.0);
        let b = self.param(&format!("{module}.bias"), &[n]);
        let mm = self.e.op(scope, "MatMul", &[x, &w], vec![]);
        self.e.op(scope, "Add", &[&b, &mm], vec![])
    }

    /// `nn.LayerNorm` over the last axis, writing to `out` when given.
    fn layer_norm(&mut self, scope: &str, module: &str, x: &str, out: Option<&str>) -> String {
        let gamma = self.weight(
            &format!("{module}.weight"),
            &format!("{module}.weight"),
            &[self.spec.hidden],
            1.0,
        );
        let beta = self.param(&format!("{module}.bias"), &[self.spec.hidden]);
        let eps = self.spec.eps;
        match self.spec.layer_norm {
            LayerNormForm::Op17 => {
                let attrs = vec![attr_int("axis", -1), attr_float("epsilon", eps)];
                let inputs = [x, gamma.as_str(), beta.as_str()];
                match out {
                    Some(o) => self.e.op_to(scope, "LayerNormalization", &inputs, o, attrs),
                    None => self.e.op(scope, "LayerNormalization", &inputs, attrs),
                }
            }
            LayerNormForm::Decomposed14 => {
                let e = &mut self.e;
                let mean = e.op(scope, "ReduceMean", &[x], vec![attr_ints("axes", &[-1])]);
                let centered = e.op(scope, "Sub", &[x, &mean], vec![]);
                let two = e.scalar_f32(scope, 2.0);
                let sq = e.op(scope, "Pow", &[&centered, &two], vec![]);
                let var = e.op(scope, "ReduceMean", &[&sq], vec![attr_ints("axes", &[-1])]);
                let eps_c = e.scalar_f32(scope, eps);
                let var_eps = e.op(scope, "Add", &[&var, &eps_c], vec![]);
                let std = e.op(scope, "Sqrt", &[&var_eps], vec![]);
                let normed = e.op(scope, "Div", &[&centered, &std], vec![]);
                let scaled = e.op(scope, "Mul", &[&normed, &gamma], vec![]);
                match out {
                    Some(o) => e.op_to(scope, "Add", &[&scaled, &beta], o, vec![]),
                    None => e.op(scope, "Add", &[&scaled, &beta], vec![]),
                }
            }
        }
    }

    /// Exact GELU as torch exports it: `x * (erf(x / √2) + 1) * 0.5`.
    fn gelu(&mut self, scope: &str, x: &str) -> String {
        let e = &mut self.e;
        let sqrt2 = e.scalar_f32(scope, std::f32::consts::SQRT_2);
        let div = e.op(scope, "Div", &[x, &sqrt2], vec![]);
        let erf = e.op(scope, "Erf", &[&div], vec![]);
        let one = e.scalar_f32(scope, 1.0);
        let add = e.op(scope, "Add", &[&erf, &one], vec![]);
        let mul = e.op(scope, "Mul", &[x, &add], vec![]);
        let half = e.scalar_f32(scope, 0.5);
        e.op(scope, "Mul", &[&mul, &half], vec![])
    }

    /// `Slice(buffer[1, max_positions], starts=0, ends=seq_len, axes=1)`: the `[:, :seq_len]` of
    /// a registered buffer. `ends` is an Unsqueeze of `seq_len` with a scoped axes constant.
    fn slice_buffer(&mut self, scope: &str, buffer: &str, seq_len: &str) -> String {
        let axes = self.e.vec_i64(scope, &[1]);
        let starts = self.e.vec_i64(scope, &[0]);
        let unsq_c = self.e.vec_i64(scope, &[0]);
        let ends = self.e.op(scope, "Unsqueeze", &[seq_len, &unsq_c], vec![]);
        let steps = self.e.vec_i64(scope, &[1]);
        self.e.op(
            scope,
            "Slice",
            &[buffer, &starts, &ends, &axes, &steps],
            vec![],
        )
    }

    fn position_ids_buffer(&mut self) -> String {
        let n = self.spec.max_positions;
        let ids: Vec<i64> = (0..n as i64).collect();
        self.e
            .anon_constant("Slice", i64_tensor(&[1, n as i64], &ids))
    }

    /// BERT: word + token type + position (sliced from the `position_ids` buffer), LayerNorm.
    /// Returns the embeddings and, with a pooler, the scalar 0 the pooler gathers with (the
    /// exporter creates it here, deduplicated with the embeddings' constants).
    fn bert_embeddings(&mut self) -> (String, Option<String>) {
        let s = "/model/embeddings";
        let seq = self.e.dim_of(s, "input_ids", 1);
        let pos_buf = self.position_ids_buffer();
        let cls_index = self.spec.with_pooler.then(|| self.e.scalar_i64(s, 0));
        let pos_ids = self.slice_buffer(s, &pos_buf, &seq);
        let x = self.sum_embeddings(s, &pos_ids, "token_type_ids");
        (x, cls_index)
    }

    /// Word + token-type + position embeddings, summed in the exporter's order, then LayerNorm.
    /// BERT and XLM-R differ only in where `pos_ids` and `token_types` come from.
    fn sum_embeddings(&mut self, s: &str, pos_ids: &str, token_types: &str) -> String {
        let h = self.spec.hidden;
        let word_w = self.param(
            "model.embeddings.word_embeddings.weight",
            &[self.spec.vocab, h],
        );
        let pos_w = self.param(
            "model.embeddings.position_embeddings.weight",
            &[self.spec.max_positions, h],
        );
        let type_w = self.param(
            "model.embeddings.token_type_embeddings.weight",
            &[self.spec.type_vocab, h],
        );
        let word = self.e.op(
            &format!("{s}/word_embeddings"),
            "Gather",
            &[&word_w, "input_ids"],
            vec![],
        );
        let types = self.e.op(
            &format!("{s}/token_type_embeddings"),
            "Gather",
            &[&type_w, token_types],
            vec![],
        );
        let sum = self.e.op(s, "Add", &[&word, &types], vec![]);
        let pos = self.e.op(
            &format!("{s}/position_embeddings"),
            "Gather",
            &[&pos_w, pos_ids],
            vec![],
        );
        let sum = self.e.op(s, "Add", &[&sum, &pos], vec![]);
        self.layer_norm(
            &format!("{s}/LayerNorm"),
            "model.embeddings.LayerNorm",
            &sum,
            None,
        )
    }

    /// XLM-R has no `token_type_ids` input: the export expands a zero `token_type_ids` buffer to
    /// `[batch, sequence]` (`buffered[:, :seq].expand(batch, seq)`).
    fn xlmr_token_type_buffer(&mut self) -> String {
        let s = "/model";
        let n = self.spec.max_positions;
        let batch = self.e.dim_of(s, "input_ids", 0);
        let seq = self.e.dim_of(s, "input_ids", 1);
        let buf = self
            .e
            .anon_constant("Slice", i64_tensor(&[1, n as i64], &vec![0; n]));
        let sliced = self.slice_buffer(s, &buf, &seq);
        let c0 = self.e.vec_i64(s, &[0]);
        let ub = self.e.op(s, "Unsqueeze", &[&batch, &c0], vec![]);
        let c0 = self.e.vec_i64(s, &[0]);
        let us = self.e.op(s, "Unsqueeze", &[&seq, &c0], vec![]);
        let shape = self
            .e
            .op(s, "Concat", &[&ub, &us], vec![attr_int("axis", 0)]);
        let minus1 = self.e.vec_i64(s, &[-1]);
        let shape = self.e.op(
            s,
            "Reshape",
            &[&shape, &minus1],
            vec![attr_int("allowzero", 0)],
        );
        // expand() treats -1 as "keep this dimension": Where(shape == -1, 1, shape).
        let rank = self.e.op(s, "Shape", &[&shape], vec![]);
        let ones = self.e.op(
            s,
            "ConstantOfShape",
            &[&rank],
            vec![attr_tensor("value", i64_tensor(&[1], &[1]))],
        );
        let m1 = self.e.scalar_i64(s, -1);
        let neg = self.e.op(s, "Mul", &[&ones, &m1], vec![]);
        let is_neg = self.e.op(s, "Equal", &[&shape, &neg], vec![]);
        let shape = self.e.op(s, "Where", &[&is_neg, &ones, &shape], vec![]);
        self.e.op(s, "Expand", &[&sliced, &shape], vec![])
    }

    /// XLM-R: position ids `cumsum(ids != pad) * (ids != pad) + pad`, then word + token type +
    /// position, LayerNorm.
    fn xlmr_embeddings(&mut self, token_types: &str) -> String {
        let s = "/model/embeddings";
        let e = &mut self.e;
        let pad = e.scalar_i64(s, XLMR_PAD_ID);
        let is_pad = e.op(s, "Equal", &["input_ids", &pad], vec![]);
        let not_pad = e.op(s, "Not", &[&is_pad], vec![]);
        let mask = e.op(
            s,
            "Cast",
            &[&not_pad],
            vec![attr_int("to", DataType::Int32 as i64)],
        );
        let axis = e.constant(s, i32_tensor(&[], &[1]));
        let cum = e.op(s, "CumSum", &[&mask, &axis], vec![]);
        let cum = e.op(s, "Mul", &[&cum, &mask], vec![]);
        let cum = e.op(
            s,
            "Cast",
            &[&cum],
            vec![attr_int("to", DataType::Int64 as i64)],
        );
        let pad = e.scalar_i64(s, XLMR_PAD_ID);
        let pos_ids = e.op(s, "Add", &[&cum, &pad], vec![]);
        self.sum_embeddings(s, &pos_ids, token_types)
    }

    /// BERT/XLM-R additive mask `(1 - mask[:, None, None, :]) * f32::MIN`, shared by all layers.
    fn extended_mask(&mut self) -> String {
        let s = "/model";
        let e = &mut self.e;
        let c1 = e.vec_i64(s, &[1]);
        let m = e.op(s, "Unsqueeze", &["attention_mask", &c1], vec![]);
        let c2 = e.vec_i64(s, &[2]);
        let m = e.op(s, "Unsqueeze", &[&m, &c2], vec![]);
        let m = e.op(
            s,
            "Cast",
            &[&m],
            vec![attr_int("to", DataType::Float as i64)],
        );
        let one = e.scalar_f32(s, 1.0);
        let inv = e.op(s, "Sub", &[&one, &m], vec![]);
        let min = e.scalar_f32(s, MASK_MIN);
        e.op(s, "Mul", &[&inv, &min], vec![])
    }

    /// `Reshape(x, Concat(Unsqueeze(dim0(x)), Unsqueeze(dim1(x)), heads, head_dim))`, the
    /// `view(new_x_shape)` of BertSelfAttention with its shape computed from `x`.
    fn split_heads(&mut self, scope: &str, x: &str) -> String {
        let (heads, dh) = (self.spec.heads as i64, self.spec.head_dim() as i64);
        let e = &mut self.e;
        let d0 = e.dim_of(scope, x, 0);
        let d1 = e.dim_of(scope, x, 1);
        let u0 = e.unsqueeze0(scope, &d0);
        let u1 = e.unsqueeze0(scope, &d1);
        let ch = e.vec_i64(scope, &[heads]);
        let cd = e.vec_i64(scope, &[dh]);
        let shape = e.op(
            scope,
            "Concat",
            &[&u0, &u1, &ch, &cd],
            vec![attr_int("axis", 0)],
        );
        e.op(
            scope,
            "Reshape",
            &[x, &shape],
            vec![attr_int("allowzero", 0)],
        )
    }

    fn transpose(&mut self, scope: &str, x: &str, perm: &[i64]) -> String {
        self.e
            .op(scope, "Transpose", &[x], vec![attr_ints("perm", perm)])
    }

    fn bert_encoder(&mut self, mut x: String, mask: &str) -> String {
        for i in 0..self.spec.layers {
            let last = i + 1 == self.spec.layers;
            x = self.bert_layer(i, &x, mask, last.then_some("last_hidden_state"));
        }
        x
    }

    fn bert_layer(&mut self, i: usize, x: &str, mask: &str, out: Option<&str>) -> String {
        let (h, f) = (self.spec.hidden, self.spec.ffn);
        let sc = format!("/model/encoder/layer.{i}");
        let md = format!("model.encoder.layer.{i}");
        let att = format!("{sc}/attention/self");
        let q = self.linear(
            &format!("{att}/query"),
            &format!("{md}.attention.self.query"),
            x,
            h,
            h,
        );
        let k = self.linear(
            &format!("{att}/key"),
            &format!("{md}.attention.self.key"),
            x,
            h,
            h,
        );
        let k = self.split_heads(&att, &k);
        let v = self.linear(
            &format!("{att}/value"),
            &format!("{md}.attention.self.value"),
            x,
            h,
            h,
        );
        let v = self.split_heads(&att, &v);
        let v = self.transpose(&att, &v, &[0, 2, 1, 3]);
        let q = self.split_heads(&att, &q);
        let q = self.transpose(&att, &q, &[0, 2, 1, 3]);
        let kt = self.transpose(&att, &k, &[0, 2, 3, 1]);
        let scores = self.e.op(&att, "MatMul", &[&q, &kt], vec![]);
        let scale = self
            .e
            .scalar_f32(&att, (self.spec.head_dim() as f32).sqrt());
        let scores = self.e.op(&att, "Div", &[&scores, &scale], vec![]);
        let scores = self.e.op(&att, "Add", &[&scores, mask], vec![]);
        let probs = self
            .e
            .op(&att, "Softmax", &[&scores], vec![attr_int("axis", -1)]);
        let ctx = self.e.op(&att, "MatMul", &[&probs, &v], vec![]);
        let ctx = self.transpose(&att, &ctx, &[0, 2, 1, 3]);
        let ctx = self.merge_heads(&att, &ctx);
        let ao = format!("{sc}/attention/output");
        let proj = self.linear(
            &format!("{ao}/dense"),
            &format!("{md}.attention.output.dense"),
            &ctx,
            h,
            h,
        );
        let res = self.e.op(&ao, "Add", &[&proj, x], vec![]);
        let x1 = self.layer_norm(
            &format!("{ao}/LayerNorm"),
            &format!("{md}.attention.output.LayerNorm"),
            &res,
            None,
        );
        let inter = format!("{sc}/intermediate");
        let up = self.linear(
            &format!("{inter}/dense"),
            &format!("{md}.intermediate.dense"),
            &x1,
            h,
            f,
        );
        let act = self.gelu(&format!("{inter}/intermediate_act_fn"), &up);
        let o = format!("{sc}/output");
        let down = self.linear(
            &format!("{o}/dense"),
            &format!("{md}.output.dense"),
            &act,
            f,
            h,
        );
        let res = self.e.op(&o, "Add", &[&down, &x1], vec![]);
        self.layer_norm(
            &format!("{o}/LayerNorm"),
            &format!("{md}.output.LayerNorm"),
            &res,
            out,
        )
    }

    /// `Reshape(ctx, Concat(dim0(ctx), dim1(ctx), hidden))`: BERT's `view(new_context_shape)`.
    fn merge_heads(&mut self, scope: &str, ctx: &str) -> String {
        let h = self.spec.hidden as i64;
        let e = &mut self.e;
        let d0 = e.dim_of(scope, ctx, 0);
        let d1 = e.dim_of(scope, ctx, 1);
        let u0 = e.unsqueeze0(scope, &d0);
        let u1 = e.unsqueeze0(scope, &d1);
        let ch = e.vec_i64(scope, &[h]);
        let shape = e.op(scope, "Concat", &[&u0, &u1, &ch], vec![attr_int("axis", 0)]);
        e.op(
            scope,
            "Reshape",
            &[ctx, &shape],
            vec![attr_int("allowzero", 0)],
        )
    }

    /// `tanh(Gemm(last_hidden_state[:, 0], W, b, transB=1))`.
    fn pooler(&mut self, h_out: &str, cls_index: Option<&str>) {
        let s = "/model/pooler";
        let h = self.spec.hidden;
        let w = self.param("model.pooler.dense.weight", &[h, h]);
        let b = self.param("model.pooler.dense.bias", &[h]);
        let idx = match cls_index {
            Some(c) => c.to_string(),
            None => self.e.scalar_i64(s, 0),
        };
        let cls = self
            .e
            .op(s, "Gather", &[h_out, &idx], vec![attr_int("axis", 1)]);
        let dense = self.e.op(
            &format!("{s}/dense"),
            "Gemm",
            &[&cls, &w, &b],
            vec![
                attr_float("alpha", 1.0),
                attr_float("beta", 1.0),
                attr_int("transB", 1),
            ],
        );
        self.e.op_to(
            &format!("{s}/activation"),
            "Tanh",
            &[&dense],
            "pooler_output",
            vec![],
        );
    }

    /// DistilBERT: word + position (sliced buffer, sequence length taken from the word
    /// embeddings' shape), LayerNorm.
    fn distilbert_embeddings(&mut self) -> String {
        let s = "/model/embeddings";
        let h = self.spec.hidden;
        let word_w = self.param(
            "model.embeddings.word_embeddings.weight",
            &[self.spec.vocab, h],
        );
        let pos_w = self.param(
            "model.embeddings.position_embeddings.weight",
            &[self.spec.max_positions, h],
        );
        let word = self.e.op(
            &format!("{s}/word_embeddings"),
            "Gather",
            &[&word_w, "input_ids"],
            vec![],
        );
        let seq = self.e.dim_of(s, &word, 1);
        let pos_buf = self.position_ids_buffer();
        let pos_ids = self.slice_buffer(s, &pos_buf, &seq);
        let pos = self.e.op(
            &format!("{s}/position_embeddings"),
            "Gather",
            &[&pos_w, &pos_ids],
            vec![],
        );
        let sum = self.e.op(s, "Add", &[&word, &pos], vec![]);
        self.layer_norm(
            &format!("{s}/LayerNorm"),
            "model.embeddings.LayerNorm",
            &sum,
            None,
        )
    }

    fn distilbert_transformer(&mut self, mut x: String) -> String {
        for i in 0..self.spec.layers {
            let last = i + 1 == self.spec.layers;
            x = self.distilbert_layer(i, &x, last.then_some("last_hidden_state"));
        }
        x
    }

    fn distilbert_layer(&mut self, i: usize, x: &str, out: Option<&str>) -> String {
        let (h, f) = (self.spec.hidden, self.spec.ffn);
        let (heads, dh) = (self.spec.heads as i64, self.spec.head_dim() as i64);
        let sc = format!("/model/transformer/layer.{i}");
        let md = format!("model.transformer.layer.{i}");
        let att = format!("{sc}/attention");
        let batch = self.e.dim_of(&att, x, 0);
        let q_len = self.e.dim_of(&att, x, 1);
        let q = self.linear(
            &format!("{att}/q_lin"),
            &format!("{md}.attention.q_lin"),
            x,
            h,
            h,
        );
        // shape(x) = x.view(bs, -1, n_heads, dim_per_head), traced once per q, k, v.
        let mut shapes = Vec::new();
        for _ in 0..3 {
            let u = self.e.unsqueeze0(&att, &batch);
            let m1 = self.e.vec_i64(&att, &[-1]);
            let ch = self.e.vec_i64(&att, &[heads]);
            let cd = self.e.vec_i64(&att, &[dh]);
            shapes.push(self.e.op(
                &att,
                "Concat",
                &[&u, &m1, &ch, &cd],
                vec![attr_int("axis", 0)],
            ));
        }
        let reshape = |b: &mut Self, t: &str, shape: &str| {
            b.e.op(&att, "Reshape", &[t, shape], vec![attr_int("allowzero", 0)])
        };
        let q = reshape(self, &q, &shapes[0]);
        let q = self.transpose(&att, &q, &[0, 2, 1, 3]);
        let k = self.linear(
            &format!("{att}/k_lin"),
            &format!("{md}.attention.k_lin"),
            x,
            h,
            h,
        );
        let k = reshape(self, &k, &shapes[1]);
        let v = self.linear(
            &format!("{att}/v_lin"),
            &format!("{md}.attention.v_lin"),
            x,
            h,
            h,
        );
        let v = reshape(self, &v, &shapes[2]);
        let v = self.transpose(&att, &v, &[0, 2, 1, 3]);
        // DistilBERT scales q before the product.
        let scale = self.e.scalar_f32(&att, (dh as f32).sqrt());
        let q = self.e.op(&att, "Div", &[&q, &scale], vec![]);
        let kt = self.transpose(&att, &k, &[0, 2, 3, 1]);
        let scores = self.e.op(&att, "MatMul", &[&q, &kt], vec![]);
        // masked_fill((mask == 0).view(bs, 1, 1, k_len).expand_as(scores), f32::MIN)
        let masked = match self.distil_mask_is_zero.clone() {
            Some(m) => m,
            None => {
                let zero = self.e.scalar_i64(&att, 0);
                let m = self.e.op(&att, "Equal", &["attention_mask", &zero], vec![]);
                self.distil_mask_is_zero = Some(m.clone());
                m
            }
        };
        let ub = self.e.unsqueeze0(&att, &batch);
        let one_a = self.e.vec_i64(&att, &[1]);
        let one_b = self.e.vec_i64(&att, &[1]);
        let uk = self.e.unsqueeze0(&att, &q_len);
        let mshape = self.e.op(
            &att,
            "Concat",
            &[&ub, &one_a, &one_b, &uk],
            vec![attr_int("axis", 0)],
        );
        let masked = reshape(self, &masked, &mshape);
        let sshape = self.e.op(&att, "Shape", &[&scores], vec![]);
        let masked = self.e.op(&att, "Expand", &[&masked, &sshape], vec![]);
        let masked = self.e.op(
            &att,
            "Cast",
            &[&masked],
            vec![attr_int("to", DataType::Bool as i64)],
        );
        let min = self.e.scalar_f32(&att, MASK_MIN);
        let scores = self.e.op(&att, "Where", &[&masked, &min, &scores], vec![]);
        let probs = self
            .e
            .op(&att, "Softmax", &[&scores], vec![attr_int("axis", -1)]);
        let ctx = self.e.op(&att, "MatMul", &[&probs, &v], vec![]);
        let ctx = self.transpose(&att, &ctx, &[0, 2, 1, 3]);
        let ub = self.e.unsqueeze0(&att, &batch);
        let m1 = self.e.vec_i64(&att, &[-1]);
        let ch = self.e.vec_i64(&att, &[h as i64]);
        let cshape = self
            .e
            .op(&att, "Concat", &[&ub, &m1, &ch], vec![attr_int("axis", 0)]);
        let ctx = reshape(self, &ctx, &cshape);
        let proj = self.linear(
            &format!("{att}/out_lin"),
            &format!("{md}.attention.out_lin"),
            &ctx,
            h,
            h,
        );
        let res = self.e.op(&sc, "Add", &[&proj, x], vec![]);
        let x1 = self.layer_norm(
            &format!("{sc}/sa_layer_norm"),
            &format!("{md}.sa_layer_norm"),
            &res,
            None,
        );
        let up = self.linear(
            &format!("{sc}/ffn/lin1"),
            &format!("{md}.ffn.lin1"),
            &x1,
            h,
            f,
        );
        let act = self.gelu(&format!("{sc}/ffn/activation"), &up);
        let down = self.linear(
            &format!("{sc}/ffn/lin2"),
            &format!("{md}.ffn.lin2"),
            &act,
            f,
            h,
        );
        let res = self.e.op(&sc, "Add", &[&down, &x1], vec![]);
        self.layer_norm(
            &format!("{sc}/output_layer_norm"),
            &format!("{md}.output_layer_norm"),
            &res,
            out,
        )
    }
}
