//! The program verifier: what the interpreter relies on, checked once after lowering.

use super::{Home, LowerError, Program};

impl Program {
    /// Checks that every step reads only values that exist when it runs, that a value sharing
    /// a buffer is dead before the next one of that buffer is made, and that buffers hold one
    /// dtype and size. Lowering runs it on what it makes; tests run it on edited programs.
    ///
    /// ```
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,4]\n%1 = erf(%0) : f32[B,4]\n%2 = erf(%1) : f32[B,4]\n\
    ///      %3 = erf(%2) : f32[B,4]\noutput \"y\" = %3\n",
    ///     None,
    /// ).unwrap();
    /// let mut p = codegen::lower::lower(&g, codegen::lower::LowerOptions { threads: 1, kernel: None, jit: false }).unwrap();
    /// assert!(p.verify().is_ok());
    /// p.steps[1].frees.clear(); // %1 now outlives the making of %3, which shares its buffer
    /// assert!(p.verify().is_err());
    /// ```
    pub fn verify(&self) -> Result<(), LowerError> {
        let bad = |node: &str, message: String| LowerError::Program {
            node: node.to_string(),
            message,
        };
        let mut live: Vec<bool> = self
            .values
            .iter()
            .map(|v| !matches!(v.home, Home::Buffer(_)))
            .collect();
        // The value each buffer holds now.
        let mut holder: Vec<Option<usize>> = vec![None; self.buffers.len()];
        for (i, st) in self.steps.iter().enumerate() {
            // A prefetch hint names a later step that reads that int8 weight.
            if let Some(t) = st.then {
                let reads = self
                    .steps
                    .get(t.step)
                    .and_then(|s| s.weight)
                    .map(|(_, w)| w);
                let int8 = self
                    .weights
                    .get(t.weight)
                    .is_some_and(|w| matches!(w.layout, super::WeightLayout::I8 { .. }));
                if t.step <= i || reads != Some(t.weight) || !int8 {
                    return Err(bad(
                        &st.node,
                        format!("then=w{} does not name a later int8 weight GEMM", t.weight),
                    ));
                }
            }
            for (i, &v) in st.inputs.iter().enumerate() {
                let weight_read = st.weight.is_some_and(|(slot, _)| slot == i);
                if !live[v] && !weight_read {
                    return Err(bad(
                        &st.node,
                        format!("reads {} when it is not live", self.values[v].name),
                    ));
                }
            }
            if let Some((slot, w)) = st.weight {
                let Some(weight) = self.weights.get(w) else {
                    return Err(bad(&st.node, format!("reads missing weight w{w}")));
                };
                if st.inputs.get(slot) != Some(&weight.source) {
                    return Err(bad(
                        &st.node,
                        format!("weight w{w} is not made from its input {slot}"),
                    ));
                }
            }
            for &v in &st.outputs {
                let Home::Buffer(b) = self.values[v].home else {
                    return Err(bad(
                        &st.node,
                        format!("output {} has no buffer", self.values[v].name),
                    ));
                };
                let buf = &self.buffers[b];
                if buf.dtype != self.values[v].ty.dtype || self.values[v].slot != b {
                    return Err(bad(
                        &st.node,
                        format!("output {} does not fit buffer b{b}", self.values[v].name),
                    ));
                }
                if let Some(other) = holder[b].filter(|&o| live[o]) {
                    return Err(bad(
                        &st.node,
                        format!(
                            "makes {} in buffer b{b} while {} still lives there",
                            self.values[v].name, self.values[other].name
                        ),
                    ));
                }
                holder[b] = Some(v);
                live[v] = true;
            }
            for &v in &st.frees {
                if matches!(self.values[v].home, Home::Buffer(_)) {
                    live[v] = false;
                }
            }
        }
        for (name, v) in &self.outputs {
            if !live[*v] {
                return Err(bad(
                    name,
                    format!("output {} is not live at the end", self.values[*v].name),
                ));
            }
        }
        Ok(())
    }
}
