//! Streams a `ModelProto` to a writer without first copying it into one buffer.
//!
//! `prost` would encode the whole model into a `Vec` — for BERT-base a second copy of 440 MB of
//! weights. Here the small parts are encoded by prost and each initializer's `raw_data` is written
//! straight from its `Bytes`. The output is byte-identical to `Message::encode_to_vec`: prost
//! writes fields in tag order, and this writer emits the same fields in the same order.

use std::io::{self, Write};

use frontend_onnx::proto::{GraphProto, ModelProto, TensorProto};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

/// Writes `model` as a binary ONNX protobuf, streaming tensor data.
///
/// The bytes are exactly those of `model.encode_to_vec()`.
///
/// ```
/// use runtime::model_builder::{build_model, write_proto, Architecture, ModelSpec};
/// use prost::Message;
/// let model = build_model(&ModelSpec::tiny(Architecture::Bert)).unwrap();
/// let mut out = Vec::new();
/// write_proto(&model, &mut out).unwrap();
/// assert_eq!(out, model.encode_to_vec());
/// ```
pub fn write_proto<W: Write>(model: &ModelProto, w: &mut W) -> io::Result<()> {
    let head = ModelProto {
        ir_version: model.ir_version,
        producer_name: model.producer_name.clone(),
        producer_version: model.producer_version.clone(),
        domain: model.domain.clone(),
        model_version: model.model_version,
        doc_string: model.doc_string.clone(),
        ..Default::default()
    };
    w.write_all(&head.encode_to_vec())?;
    if let Some(graph) = &model.graph {
        let mut buf = Vec::new();
        encode_key(7, WireType::LengthDelimited, &mut buf);
        encode_varint(graph.encoded_len() as u64, &mut buf);
        w.write_all(&buf)?;
        write_graph(graph, w)?;
    }
    let tail = ModelProto {
        opset_import: model.opset_import.clone(),
        metadata_props: model.metadata_props.clone(),
        ..Default::default()
    };
    w.write_all(&tail.encode_to_vec())
}

fn write_graph<W: Write>(graph: &GraphProto, w: &mut W) -> io::Result<()> {
    // GraphProto tags: node 1, name 2, initializer 5, doc_string 10, input 11, output 12,
    // value_info 13.
    let head = GraphProto {
        node: graph.node.clone(),
        name: graph.name.clone(),
        ..Default::default()
    };
    w.write_all(&head.encode_to_vec())?;
    for t in &graph.initializer {
        write_tensor_field(5, t, w)?;
    }
    let tail = GraphProto {
        doc_string: graph.doc_string.clone(),
        input: graph.input.clone(),
        output: graph.output.clone(),
        value_info: graph.value_info.clone(),
        ..Default::default()
    };
    w.write_all(&tail.encode_to_vec())
}

/// Writes `t` as field `tag` of the enclosing message.
fn write_tensor_field<W: Write>(tag: u32, t: &TensorProto, w: &mut W) -> io::Result<()> {
    let mut buf = Vec::new();
    // raw_data is tag 9; fields with larger tags would have to follow it, so only tensors without
    // them take the streaming path.
    let streamable = !t.raw_data.is_empty()
        && t.doc_string.is_empty()
        && t.external_data.is_empty()
        && t.data_location == 0
        && t.double_data.is_empty()
        && t.uint64_data.is_empty();
    if !streamable {
        prost::encoding::message::encode(tag, t, &mut buf);
        return w.write_all(&buf);
    }
    let header = TensorProto {
        raw_data: bytes::Bytes::new(),
        ..t.clone()
    };
    let raw_len = t.raw_data.len();
    let raw_field_len = key_len(9) + encoded_len_varint(raw_len as u64) + raw_len;
    encode_key(tag, WireType::LengthDelimited, &mut buf);
    encode_varint((header.encoded_len() + raw_field_len) as u64, &mut buf);
    header.encode_raw(&mut buf);
    encode_key(9, WireType::LengthDelimited, &mut buf);
    encode_varint(raw_len as u64, &mut buf);
    w.write_all(&buf)?;
    w.write_all(&t.raw_data)
}
