//! [`Model`]: an imported graph with its public inputs and outputs.

use std::path::Path;

use ir::{Graph, Op, TensorType};

use crate::Error;

/// A graph input or output: its public name and type (dtype and possibly symbolic shape).
#[derive(Clone, Debug, PartialEq)]
pub struct IoSpec {
    pub name: String,
    pub ty: TensorType,
}

/// An imported model, ready to compile into a [`crate::Session`].
///
/// ```
/// use runtime::Model;
/// let g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
///     None,
/// ).unwrap();
/// let m = Model::from_graph(g).unwrap();
/// assert_eq!(m.inputs()[0].name, "x");
/// assert_eq!(m.outputs()[0].ty.to_string(), "f32[B,2]");
/// ```
#[derive(Clone, Debug)]
pub struct Model {
    graph: Graph,
}

impl Model {
    /// Opens a model: an ONNX file (weights memory-mapped where the importer can), or a compiled
    /// model file written by [`Model::save`] (`.encore`: quantized and fused, weights
    /// memory-mapped). The kind is told by the file's content, not its name.
    ///
    /// ```no_run
    /// let fp32 = runtime::Model::load("../shared/models/minilm-l6/model.onnx")?;
    /// let int8 = runtime::Model::load("minilm.int8.encore")?; // written by `Model::save`
    /// assert!(!fp32.is_quantized() && int8.is_quantized());
    /// # Ok::<(), runtime::Error>(())
    /// ```
    ///
    /// A missing or malformed file is an error that names it:
    ///
    /// ```
    /// let err = runtime::Model::load("/no/such/model.onnx").unwrap_err();
    /// assert!(err.to_string().contains("/no/such/model.onnx"), "{err}");
    /// ```
    pub fn load(path: impl AsRef<Path>) -> Result<Model, Error> {
        let path = path.as_ref();
        let graph = if crate::compiled::is_compiled(path) {
            crate::compiled::load(path)?
        } else {
            frontend_onnx::import_path(path)?
        };
        Model::from_graph(graph)
    }

    /// Writes the model as one compiled file (safetensors: the constants as tensors, the graph
    /// in the IR text form in the metadata) that [`Model::load`] opens with no ONNX beside it.
    ///
    /// ```
    /// use runtime::Model;
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let path = std::env::temp_dir().join(format!("doc-{}.encore", std::process::id()));
    /// Model::from_graph(g).unwrap().save(&path).unwrap();
    /// let back = Model::load(&path).unwrap();
    /// assert_eq!(back.outputs()[0].name, "y");
    /// # std::fs::remove_file(&path).ok();
    /// ```
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        crate::compiled::save(&self.graph, path.as_ref())
    }

    /// Whether the graph holds integer (quantized) products.
    pub fn is_quantized(&self) -> bool {
        self.graph.node_ids().any(|id| {
            matches!(
                self.graph.node(id).op,
                Op::QLinear { .. } | Op::QMatMul | Op::MatMulInteger | Op::DequantizeLinear { .. }
            )
        })
    }

    /// Wraps a graph built in memory (or parsed from the text form); checks it first.
    pub fn from_graph(graph: Graph) -> Result<Model, Error> {
        graph.verify()?;
        Ok(Model { graph })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn into_graph(self) -> Graph {
        self.graph
    }

    /// The graph inputs, in declaration order.
    pub fn inputs(&self) -> Vec<IoSpec> {
        self.graph
            .inputs()
            .iter()
            .map(|&id| {
                let n = self.graph.node(id);
                let name = match &n.op {
                    Op::Input { name } => name.clone(),
                    _ => n.name.clone(),
                };
                IoSpec {
                    name,
                    ty: n.outputs[0].clone(),
                }
            })
            .collect()
    }

    /// The names of the graph inputs, in declaration order.
    pub fn input_names(&self) -> Vec<String> {
        self.inputs().into_iter().map(|s| s.name).collect()
    }

    /// The graph outputs, in declaration order.
    pub fn outputs(&self) -> Vec<IoSpec> {
        self.graph
            .outputs()
            .iter()
            .map(|(name, o)| IoSpec {
                name: name.clone(),
                ty: self.graph.outlet_type(*o).clone(),
            })
            .collect()
    }

    /// The names of the graph outputs, in declaration order.
    pub fn output_names(&self) -> Vec<String> {
        self.graph
            .outputs()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }
}
