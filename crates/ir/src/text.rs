//! The stable text form: one line per node, in a deterministic topological order.
//!
//! ```text
//! %0 = input[name="input_ids"] : i64[batch,sequence]
//! %1 = const[value=f32[1000,128]{extern}] : f32[1000,128]  # embeddings.word_embeddings.weight
//! %2 = gather[axis=0](%1, %0) : f32[batch,sequence,128]  # /embeddings/word_embeddings/Gather
//! %3 = dynamic_quantize_linear(%2) : (u8[batch,sequence,128], f32[], u8[])
//! output "last_hidden_state" = %2
//! ```
//!
//! A node whose op holds a graph (the body of a [`Op::Loop`]) is followed by that graph as an
//! indented block, named after its attribute; the block numbers its own values from `%0` and
//! sees nothing of the enclosing graph but what the node passes it:
//!
//! ```text
//! %6 = loop[carried=1](%4, %5, %0, %2) : (f32[], f32[*])  # Loop
//!   body {
//!     %0 = input[name="i"] : i64[]  # i
//!     ...
//!     output "next" = %4
//!   }
//! ```
//!
//! Values are numbered in print order; `%3.1` is output 1 of node `%3`. Constants of at most
//! [`crate::INLINE_LIMIT`] elements are printed inline; larger ones print as `{extern}`, and
//! [`parse`] turns them into constants without data unless a [`ConstantSource`] supplies them
//! (by node name). The node name after `#` is the name the node had in the source model.
//! Printing, parsing and printing again gives the same text.

use std::collections::HashMap;
use std::fmt::Write;

use crate::{Attr, Graph, IrError, NodeId, Op, Outlet, Tensor, TensorType};

/// Prints a graph in the text form.
///
/// ```
/// use ir::{text, DType, Dim, Graph, Op, TensorType, UnaryOp};
/// let mut g = Graph::new();
/// let t = TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::fixed(4)]);
/// let x = g.add_input("x", t.clone());
/// let y = g.add_node(Op::Unary(UnaryOp::Erf), "e", &[x], vec![t]).unwrap();
/// g.set_output("y", y.into());
/// let s = text::print(&g).unwrap();
/// assert_eq!(s, "%0 = input[name=\"x\"] : f32[B,4]  # x\n%1 = erf(%0) : f32[B,4]  # e\noutput \"y\" = %1\n");
/// assert_eq!(text::print(&text::parse(&s, None).unwrap()).unwrap(), s);
/// ```
pub fn print(graph: &Graph) -> Result<String, IrError> {
    let mut out = String::new();
    print_into(graph, "", &mut out)?;
    Ok(out)
}

/// Prints `graph` with every line prefixed by `indent` (a nested block's lines are indented
/// further, for the reader: the parser ignores indentation).
fn print_into(graph: &Graph, indent: &str, out: &mut String) -> Result<(), IrError> {
    let order = graph.topo_order()?;
    let number: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let outlet_name = |o: Outlet| {
        if o.slot == 0 {
            format!("%{}", number[&o.node])
        } else {
            format!("%{}.{}", number[&o.node], o.slot)
        }
    };
    for &id in &order {
        let node = graph.node(id);
        write!(out, "{indent}%{} = {}", number[&id], node.op.name()).unwrap();
        let (blocks, attrs): (Vec<_>, Vec<_>) = node
            .op
            .attrs()
            .into_iter()
            .partition(|(_, v)| matches!(v, Attr::Graph(_)));
        if !attrs.is_empty() {
            out.push('[');
            for (i, (k, v)) in attrs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write!(out, "{k}={v}").unwrap();
            }
            out.push(']');
        }
        let inputs = graph.node_inputs(id);
        if !inputs.is_empty() {
            let names: Vec<String> = inputs.iter().map(|&o| outlet_name(o)).collect();
            write!(out, "({})", names.join(", ")).unwrap();
        }
        out.push_str(" : ");
        if node.outputs.len() == 1 {
            write!(out, "{}", node.outputs[0]).unwrap();
        } else {
            let tys: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
            write!(out, "({})", tys.join(", ")).unwrap();
        }
        if !node.name.is_empty() {
            write!(out, "  # {}", node.name.replace(['\n', '\r'], " ")).unwrap();
        }
        out.push('\n');
        for (k, v) in blocks {
            let Attr::Graph(g) = v else {
                unreachable!("partitioned above")
            };
            writeln!(out, "{indent}  {k} {{").unwrap();
            print_into(&g, &format!("{indent}    "), out)?;
            writeln!(out, "{indent}  }}").unwrap();
        }
    }
    for (name, o) in graph.outputs() {
        writeln!(out, "{indent}output {} = {}", quote(name), outlet_name(*o)).unwrap();
    }
    Ok(())
}

/// Supplies the data of constants printed as `{extern}`, by node name.
pub trait ConstantSource {
    fn constant(&self, node_name: &str) -> Option<Tensor>;
}

impl ConstantSource for HashMap<String, Tensor> {
    fn constant(&self, node_name: &str) -> Option<Tensor> {
        self.get(node_name).cloned()
    }
}

/// Parses the text form. Constants printed as `{extern}` get their data from `constants` when
/// given (it must agree on dtype and shape), or stay without data.
pub fn parse(text: &str, constants: Option<&dyn ConstantSource>) -> Result<Graph, IrError> {
    let mut lines = Lines {
        lines: text.lines().enumerate().peekable(),
    };
    parse_block(&mut lines, constants, None, 0)
}

/// How deeply graph blocks may nest: far beyond any real model (a loop in a loop is rare), and
/// a bound on the parser's recursion, so that hostile text is an error and not a stack overflow.
pub const MAX_NESTING: usize = 32;

/// The lines of a text form, numbered from 1, blank lines and `#` comments skipped.
struct Lines<'a> {
    lines: std::iter::Peekable<std::iter::Enumerate<std::str::Lines<'a>>>,
}

impl<'a> Lines<'a> {
    fn peek(&mut self) -> Option<(usize, &'a str)> {
        while let Some(&(i, raw)) = self.lines.peek() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                self.lines.next();
                continue;
            }
            return Some((i + 1, line));
        }
        None
    }
    fn next(&mut self) -> Option<(usize, &'a str)> {
        let l = self.peek();
        self.lines.next();
        l
    }
}

/// The name of a graph block that `line` opens (`body {`), if it is one.
fn block_opening(line: &str) -> Option<&str> {
    let name = line.strip_suffix('{')?.trim_end();
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(name)
}

/// Parses nodes and outputs up to the end of the text (the top level, `opened_at` None) or
/// to the `}` closing the block opened at line `opened_at`, `depth` blocks deep.
fn parse_block(
    lines: &mut Lines<'_>,
    constants: Option<&dyn ConstantSource>,
    opened_at: Option<usize>,
    depth: usize,
) -> Result<Graph, IrError> {
    let mut g = Graph::new();
    let mut values: HashMap<usize, NodeId> = HashMap::new();
    while let Some((line_no, line)) = lines.next() {
        let err = |message: String| IrError::Parse {
            line: line_no,
            message,
        };
        if line == "}" {
            return match opened_at {
                Some(_) => Ok(g),
                None => Err(err("`}` closes no block".into())),
            };
        }
        if let Some(name) = block_opening(line) {
            return Err(err(format!("block `{name}` follows no node")));
        }
        let mut c = Cursor::new(line, line_no);
        if c.eat_word("output") {
            let name = c.string()?;
            c.expect('=')?;
            let o = c.outlet(&values)?;
            c.end()?;
            g.set_output(&name, o);
            continue;
        }
        let id = c.value_id()?;
        if values.contains_key(&id) {
            return Err(err(format!("%{id} is defined twice")));
        }
        c.expect('=')?;
        let op_name = c.ident()?;
        let mut attrs = Vec::new();
        if c.eat('[') {
            loop {
                let key = c.ident()?;
                c.expect('=')?;
                attrs.push((key, c.attr()?));
                if c.eat(']') {
                    break;
                }
                c.expect(',')?;
            }
        }
        let mut inputs = Vec::new();
        if c.eat('(') {
            loop {
                inputs.push(c.outlet(&values)?);
                if c.eat(')') {
                    break;
                }
                c.expect(',')?;
            }
        }
        c.expect(':')?;
        let mut types = Vec::new();
        if c.eat('(') {
            // `()`: no outputs (a loop whose body gives only its condition).
            while !c.eat(')') {
                if !types.is_empty() {
                    c.expect(',')?;
                }
                types.push(c.tensor_type()?);
            }
        } else {
            types.push(c.tensor_type()?);
        }
        let name = if c.eat('#') {
            c.rest().trim().to_string()
        } else {
            c.end()?;
            String::new()
        };
        // Graph attributes follow their node as blocks.
        while let Some(key) = lines.peek().and_then(|(_, l)| block_opening(l)) {
            let (at, _) = lines.next().expect("peeked");
            if depth == MAX_NESTING {
                return Err(IrError::Parse {
                    line: at,
                    message: format!("blocks nest more than {MAX_NESTING} deep"),
                });
            }
            let body = parse_block(lines, constants, Some(at), depth + 1)?;
            attrs.push((key.to_string(), Attr::Graph(std::sync::Arc::new(body))));
        }
        let mut op = Op::from_parts(&op_name, attrs).map_err(|e| err(e.to_string()))?;
        if let (Op::Const { value }, Some(src)) = (&mut op, constants) {
            if !value.has_data() {
                if let Some(t) = src.constant(&name) {
                    if t.dtype() != value.dtype() || t.shape() != value.shape() {
                        return Err(err(format!(
                            "constant `{name}` from the source is {:?}, the text says {:?}",
                            t, value
                        )));
                    }
                    *value = t;
                }
            }
        }
        let node = match op {
            Op::Input { name: input_name } => {
                if types.len() != 1 {
                    return Err(err("an input has one type".into()));
                }
                let o = g.add_input(&input_name, types.pop().expect("one type"));
                g.node_mut(o.node).name = name;
                o.node
            }
            op => g
                .add_node(op, &name, &inputs, types)
                .map_err(|e| err(e.to_string()))?,
        };
        values.insert(id, node);
    }
    match opened_at {
        None => Ok(g),
        Some(line) => Err(IrError::Parse {
            line,
            message: "the block opened here is not closed by `}`".into(),
        }),
    }
}

/// Quotes a string for the text form.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Cursor<'a> {
    s: &'a str,
    pos: usize,
    line: usize,
}

impl<'a> Cursor<'a> {
    fn new(s: &'a str, line: usize) -> Self {
        Cursor { s, pos: 0, line }
    }
    fn err(&self, message: impl Into<String>) -> IrError {
        IrError::Parse {
            line: self.line,
            message: format!("{} (at column {})", message.into(), self.pos + 1),
        }
    }
    fn skip_ws(&mut self) {
        while self.s[self.pos..].starts_with([' ', '\t']) {
            self.pos += 1;
        }
    }
    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.s[self.pos..].chars().next()
    }
    fn eat(&mut self, ch: char) -> bool {
        if self.peek() == Some(ch) {
            self.pos += ch.len_utf8();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, ch: char) -> Result<(), IrError> {
        if self.eat(ch) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{ch}`")))
        }
    }
    fn eat_word(&mut self, w: &str) -> bool {
        self.skip_ws();
        let rest = &self.s[self.pos..];
        if rest.starts_with(w) && rest[w.len()..].starts_with([' ', '\t']) {
            self.pos += w.len();
            true
        } else {
            false
        }
    }
    fn end(&mut self) -> Result<(), IrError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.err("unexpected text at end of line")),
        }
    }
    fn rest(&mut self) -> &'a str {
        let r = &self.s[self.pos..];
        self.pos = self.s.len();
        r
    }
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        self.skip_ws();
        let start = self.pos;
        while let Some(c) = self.s[self.pos..].chars().next() {
            if !f(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
        &self.s[start..self.pos]
    }
    fn ident(&mut self) -> Result<String, IrError> {
        let w = self.take_while(|c| c.is_ascii_alphanumeric() || c == '_');
        if w.is_empty() {
            return Err(self.err("expected a name"));
        }
        Ok(w.to_string())
    }
    fn number_token(&mut self) -> &'a str {
        self.take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
    }
    fn value_id(&mut self) -> Result<usize, IrError> {
        self.expect('%')?;
        let t = self.take_while(|c| c.is_ascii_digit());
        t.parse().map_err(|_| self.err("expected a value number"))
    }
    fn outlet(&mut self, values: &HashMap<usize, NodeId>) -> Result<Outlet, IrError> {
        let id = self.value_id()?;
        let node = *values
            .get(&id)
            .ok_or_else(|| self.err(format!("%{id} is used before it is defined")))?;
        let slot = if self.s[self.pos..].starts_with('.') {
            self.pos += 1;
            let t = self.take_while(|c| c.is_ascii_digit());
            t.parse()
                .map_err(|_| self.err("expected an output number"))?
        } else {
            0
        };
        Ok(Outlet::new(node, slot))
    }
    fn string(&mut self) -> Result<String, IrError> {
        self.expect('"')?;
        let mut out = String::new();
        let mut chars = self.s[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, c)) => out.push(c),
                    None => break,
                },
                c => out.push(c),
            }
        }
        Err(self.err("unterminated string"))
    }
    /// A bracketed span `open … close` (no nesting of the same kind inside), returned with the
    /// brackets.
    fn span_until(&mut self, close: char) -> Result<&'a str, IrError> {
        let start = self.pos;
        let end = self.s[self.pos..]
            .find(close)
            .ok_or_else(|| self.err(format!("expected `{close}`")))?;
        self.pos += end + 1;
        Ok(&self.s[start..self.pos])
    }
    fn tensor_type(&mut self) -> Result<TensorType, IrError> {
        self.skip_ws();
        let start = self.pos;
        self.ident()?;
        if !self.s[self.pos..].starts_with('[') {
            return Err(self.err("expected `[` after the dtype"));
        }
        self.span_until(']')?;
        self.s[start..self.pos]
            .parse()
            .map_err(|e: IrError| self.err(e.to_string()))
    }
    fn attr(&mut self) -> Result<Attr, IrError> {
        match self.peek() {
            Some('"') => Ok(Attr::Str(self.string()?)),
            Some('(') => {
                let body = self.span_until(')')?;
                let inner = body[1..body.len() - 1].trim();
                if inner.is_empty() {
                    return Ok(Attr::List(Vec::new()));
                }
                Ok(Attr::List(
                    inner.split(',').map(|w| w.trim().to_string()).collect(),
                ))
            }
            Some('[') => {
                self.pos += 1;
                let mut v = Vec::new();
                if self.eat(']') {
                    return Ok(Attr::Ints(v));
                }
                loop {
                    let t = self.number_token();
                    v.push(
                        t.parse()
                            .map_err(|_| self.err(format!("bad integer `{t}`")))?,
                    );
                    if self.eat(']') {
                        return Ok(Attr::Ints(v));
                    }
                    self.expect(',')?;
                }
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                let w = self.ident()?;
                if self.s[self.pos..].starts_with('[') {
                    self.span_until(']')?;
                    if !self.s[self.pos..].starts_with('{') {
                        return Err(self.err("expected `{` in a tensor literal"));
                    }
                    self.span_until('}')?;
                    return Tensor::from_text(&self.s[start..self.pos])
                        .map(Attr::Tensor)
                        .map_err(|e| self.err(e.to_string()));
                }
                match w.as_str() {
                    "true" => Ok(Attr::Bool(true)),
                    "false" => Ok(Attr::Bool(false)),
                    "inf" => Ok(Attr::Float(f32::INFINITY)),
                    "NaN" => Ok(Attr::Float(f32::NAN)),
                    _ => w
                        .parse()
                        .map(Attr::DType)
                        .map_err(|_| self.err(format!("bad attribute value `{w}`"))),
                }
            }
            _ => {
                let t = self.number_token();
                if let Ok(i) = t.parse::<i64>() {
                    Ok(Attr::Int(i))
                } else {
                    t.parse::<f32>()
                        .map(Attr::Float)
                        .map_err(|_| self.err(format!("bad attribute value `{t}`")))
                }
            }
        }
    }
}
