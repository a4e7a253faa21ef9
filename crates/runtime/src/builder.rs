//! [`SessionBuilder`]: [`CompileOptions`] set one by one, then [`SessionBuilder::build`].

use crate::{CompileOptions, Error, Kernel, Model, Session};

/// Compiles a [`Model`] into a [`Session`] with options set one at a time; what is not set keeps
/// its [`CompileOptions::default`]. Made by [`Session::builder`].
///
/// ```
/// use runtime::{Model, Session, TensorValue};
/// let g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,2]\n\
///      %1 = const[value=f32[2,2]{1.0, 0.0, 0.0, 2.0}] : f32[2,2]\n\
///      %2 = matmul(%0, %1) : f32[B,2]\n\
///      output \"y\" = %2\n",
///     None,
/// ).unwrap();
/// let model = Model::from_graph(g)?;
/// let session = Session::builder(&model)
///     .threads(2)
///     .max_batch(8)
///     .kernel(runtime::Kernel::Scalar) // the portable reference kernels, on any CPU
///     .build()?;
/// assert_eq!(session.options().threads, 2);
/// let x = TensorValue::from_f32(vec![1, 2], vec![3.0, 4.0])?;
/// let out = session.run(&[("x", x)])?;
/// assert_eq!(out[0].1.as_f32().unwrap(), &[3.0, 8.0]);
/// # Ok::<(), runtime::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SessionBuilder<'m> {
    model: &'m Model,
    opts: CompileOptions,
}

impl Session {
    /// A [`SessionBuilder`] for `model`, starting from [`CompileOptions::default`].
    ///
    /// ```
    /// # let g = ir::text::parse("%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n", None).unwrap();
    /// # let model = runtime::Model::from_graph(g).unwrap();
    /// let session = runtime::Session::builder(&model).threads(1).build()?;
    /// assert_eq!(session.output_names(), ["y"]);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn builder(model: &Model) -> SessionBuilder<'_> {
        SessionBuilder {
            model,
            opts: CompileOptions::default(),
        }
    }
}

impl<'m> SessionBuilder<'m> {
    /// Starts from these options instead of the defaults.
    pub fn options(mut self, opts: CompileOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Worker threads of one run (GEMMs, attention, row-parallel ops); 0 counts as 1. Default:
    /// the available cores. The result is the same bit for bit whatever the count.
    pub fn threads(mut self, threads: usize) -> Self {
        self.opts.threads = threads;
        self
    }

    /// Refuses larger batches with [`Error::BatchTooLarge`].
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.opts.max_batch = Some(max_batch);
        self
    }

    /// Whether to run the declutter pipeline (shape folding, recognition of Linear, LayerNorm,
    /// GELU and Attention) before compiling. Default: on. Off also turns fusion off in effect
    /// (fusion runs after declutter).
    pub fn optimize(mut self, on: bool) -> Self {
        self.opts.optimize = on;
        self
    }

    /// Whether to run the `fuse` pipeline after declutter (quantized dialects onto the integer
    /// GEMMs, epilogue fusion). Default: on; off to observe unfused layers or to debug.
    pub fn fuse(mut self, on: bool) -> Self {
        self.opts.fuse = on;
        self
    }

    /// Whether int8 GEMM loop nests run as JIT-compiled code (see [`CompileOptions::jit`]).
    /// Default: on unless `ENCORE_JIT=0`. Results are the same bit for bit either way.
    pub fn jit(mut self, on: bool) -> Self {
        self.opts.jit = on;
        self
    }

    /// Whether to compute only the real tokens of a batch (see
    /// [`CompileOptions::padding_free`]). Default: on.
    pub fn padding_free(mut self, on: bool) -> Self {
        self.opts.padding_free = on;
        self
    }

    /// Tokens per part of a batch run in parts, or `None` to run every batch whole (see
    /// [`CompileOptions::batch_tokens`]). Default: [`crate::DEFAULT_BATCH_TOKENS`].
    pub fn batch_tokens(mut self, tokens: Option<usize>) -> Self {
        self.opts.batch_tokens = tokens;
        self
    }

    /// Forces the microkernel family of the weight GEMMs (see [`CompileOptions::kernel`]); the
    /// build fails if this CPU lacks it ([`Kernel::is_supported`]).
    ///
    /// ```
    /// # let g = ir::text::parse("%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n", None).unwrap();
    /// # let model = runtime::Model::from_graph(g).unwrap();
    /// use runtime::{Kernel, Session};
    /// for k in Kernel::ALL {
    ///     let built = Session::builder(&model).kernel(k).build();
    ///     assert_eq!(built.is_ok(), k.is_supported(), "{}", k.name());
    /// }
    /// ```
    pub fn kernel(mut self, kernel: Kernel) -> Self {
        self.opts.kernel = Some(kernel);
        self
    }

    /// The options as set so far.
    pub fn compile_options(&self) -> &CompileOptions {
        &self.opts
    }

    /// Compiles the model ([`Session::new`] with the options set).
    pub fn build(self) -> Result<Session, Error> {
        Session::new(self.model, self.opts)
    }
}
