//! The text form of a [`Program`] (`encore dump --after lower`): stable, one line per item, with
//! values named as in the IR dump so the two can be read side by side.

use std::fmt::Write as _;

use ir::Dim;

use super::{Home, Lookup, Program, StepJit, WeightLayout};

impl Program {
    /// Prints the program: inputs, packed weights, planned buffers, steps, outputs.
    ///
    /// ```
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,4]\n%1 = erf(%0) : f32[B,4]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let p = codegen::lower::lower(&g, codegen::lower::LowerOptions { threads: 2, kernel: None, jit: false }).unwrap();
    /// assert_eq!(
    ///     p.to_text(),
    ///     "program threads=2 slots=2\n\
    ///      split batch=B\n\
    ///      input \"x\" = %0 : f32[B,4]\n\
    ///      buffer b0 = f32[4*B] (16*B bytes): %1\n\
    ///      %1@b0 = erf(%0) : f32[B,4]\n\
    ///      output \"y\" = %1\n"
    /// );
    /// ```
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        writeln!(out, "program threads={} slots={}", self.threads, self.slots).unwrap();
        if let Some(why) = &self.jit_unavailable {
            writeln!(out, "// interpreted loops: {why}").unwrap();
        }
        match &self.batch {
            Ok(split) => {
                write!(out, "split batch={}", split.symbol).unwrap();
                if let Some(t) = &split.tokens {
                    write!(out, " tokens={}", ir::text::quote(t)).unwrap();
                }
                out.push('\n');
            }
            Err(why) => writeln!(out, "// batch not split: {why}").unwrap(),
        }
        for (name, v) in &self.inputs {
            let v = &self.values[*v];
            writeln!(
                out,
                "input {} = {} : {}",
                ir::text::quote(name),
                v.name,
                v.ty
            )
            .unwrap();
        }
        for (i, w) in self.weights.iter().enumerate() {
            let src = &self.values[w.source].name;
            let layout = match &w.layout {
                WeightLayout::I8 { kernel, k, n } => {
                    format!("pack_i8[kernel={}, k={k}, n={n}]", kernel.name())
                }
                WeightLayout::F32 {
                    kernel,
                    k,
                    n,
                    transposed,
                } => format!(
                    "pack_f32[kernel={}, k={k}, n={n}{}]",
                    kernel.name(),
                    if *transposed { ", transposed" } else { "" }
                ),
                WeightLayout::Table { rows, width } => {
                    format!("table_in_place[rows={rows}, width={width}]")
                }
            };
            writeln!(out, "weight w{i} = {layout}({src})").unwrap();
        }
        for (i, b) in self.buffers.iter().enumerate() {
            let names: Vec<&str> = b.values.iter().map(|&v| &*self.values[v].name).collect();
            let size = match &b.elems {
                Some(e) => format!(
                    "{}[{e}] ({} bytes)",
                    b.dtype,
                    e.mul(&Dim::fixed(b.dtype.size_of()))
                ),
                None => format!("{}[?] (sized at run time)", b.dtype),
            };
            writeln!(out, "buffer b{i} = {size}: {}", names.join(", ")).unwrap();
        }
        for st in &self.steps {
            let outs: Vec<String> = st.outputs.iter().map(|&v| self.value_at(v)).collect();
            let lhs = if outs.len() == 1 {
                outs[0].clone()
            } else {
                format!("({})", outs.join(", "))
            };
            write!(out, "{lhs} = {}", st.op.name()).unwrap();
            let attrs = st.op.attrs();
            if !attrs.is_empty() {
                let a: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(out, "[{}]", a.join(", ")).unwrap();
            }
            let args: Vec<String> = st
                .inputs
                .iter()
                .enumerate()
                .map(|(i, &v)| match st.weight {
                    Some((slot, w)) if slot == i => format!("w{w}"),
                    _ => self.values[v].name.clone(),
                })
                .collect();
            if !args.is_empty() {
                write!(out, "({})", args.join(", ")).unwrap();
            }
            let tys: Vec<String> = st
                .outputs
                .iter()
                .map(|&v| self.values[v].ty.to_string())
                .collect();
            if tys.len() == 1 {
                write!(out, " : {}", tys[0]).unwrap();
            } else {
                write!(out, " : ({})", tys.join(", ")).unwrap();
            }
            if let Some(s) = &st.split {
                write!(out, " split={s}").unwrap();
            }
            if let Some(t) = &st.then {
                write!(out, " then=w{}", t.weight).unwrap();
            }
            match &st.jit {
                Some(StepJit::Int8(u)) => {
                    let s = u.shape;
                    write!(
                        out,
                        " jit=unit_i8(mr={}, nr={}, k_pad={}, ldacc={})",
                        s.mr, s.nr, s.k_pad, s.ldacc
                    )
                    .unwrap();
                }
                Some(StepJit::F32(u)) => {
                    let s = u.shape;
                    write!(
                        out,
                        " jit=unit_f32(mr={}, nr={}, k={}, n={}, kc={})",
                        s.mr, s.nr, s.k, s.n, s.kc
                    )
                    .unwrap();
                }
                None => {}
            }
            match &st.lookup {
                Lookup::Plain => {}
                Lookup::Token { input } => {
                    write!(out, " check=token({})", ir::text::quote(input)).unwrap()
                }
                Lookup::Position { limit: Some(l) } => {
                    write!(out, " check=position(limit={l})").unwrap()
                }
                Lookup::Position { limit: None } => write!(out, " check=position").unwrap(),
            }
            if !st.frees.is_empty() {
                let f: Vec<&str> = st.frees.iter().map(|&v| &*self.values[v].name).collect();
                write!(out, " free({})", f.join(", ")).unwrap();
            }
            if !st.node.is_empty() {
                write!(out, "  # {}", st.node.replace(['\n', '\r'], " ")).unwrap();
            }
            out.push('\n');
        }
        for (name, v) in &self.outputs {
            writeln!(
                out,
                "output {} = {}",
                ir::text::quote(name),
                self.values[*v].name
            )
            .unwrap();
        }
        out
    }

    /// `%N@bK` for a value in a buffer, else its name.
    fn value_at(&self, v: usize) -> String {
        let val = &self.values[v];
        match val.home {
            Home::Buffer(b) => format!("{}@b{b}", val.name),
            _ => val.name.clone(),
        }
    }
}
