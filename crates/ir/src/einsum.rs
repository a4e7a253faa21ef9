//! The meaning of an `Einsum` equation, shared by shape inference and the kernel.

/// An equation resolved against the ranks of its operands: each operand axis and each output
/// axis as a label number (`0..labels`). A label repeated within one operand takes its
/// diagonal; labels absent from the output are summed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EinsumPlan {
    pub operands: Vec<Vec<usize>>,
    pub output: Vec<usize>,
    pub labels: usize,
}

/// Resolves `equation` (numpy/ONNX form: `"bij,bjk->bik"`, `"...ii->...i"`, implicit output
/// when there is no `->`: the ellipsis dims, then the letters used once, in alphabetical
/// order) for operands of `ranks`. Ellipses of different lengths align to the right.
///
/// ```
/// let p = ir::einsum_plan("bij,bjk->bik", &[3, 3]).unwrap();
/// assert_eq!(p.operands, vec![vec![0, 1, 2], vec![0, 2, 3]]);
/// assert_eq!(p.output, vec![0, 1, 3]);
/// let p = ir::einsum_plan("...ii->...i", &[3]).unwrap();
/// assert_eq!((p.operands, p.output), (vec![vec![0, 1, 1]], vec![0, 1]));
/// assert!(ir::einsum_plan("ij,jk", &[2]).is_err());
/// ```
pub fn einsum_plan(equation: &str, ranks: &[usize]) -> Result<EinsumPlan, String> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!(
            "equation `{equation}` has {} operands, the node {}",
            terms.len(),
            ranks.len()
        ));
    }
    // Letters of each term, with the ellipsis's position.
    let parse = |t: &str| -> Result<(Vec<char>, Option<usize>), String> {
        let (head, tail, ell) = match t.split_once("...") {
            Some((h, r)) => (h, r, true),
            None => (t, "", false),
        };
        let letters: Vec<char> = head.chars().chain(tail.chars()).collect();
        if let Some(c) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(format!("equation `{equation}`: `{c}` is not a letter"));
        }
        Ok((letters, ell.then(|| head.chars().count())))
    };
    let mut parsed = Vec::new();
    let mut ell_len = 0;
    for (t, &r) in terms.iter().zip(ranks) {
        let (letters, ell) = parse(t)?;
        match ell {
            Some(_) if letters.len() <= r => ell_len = ell_len.max(r - letters.len()),
            None if letters.len() == r => {}
            _ => {
                return Err(format!(
                    "equation `{equation}`: term `{t}` does not fit rank {r}"
                ))
            }
        }
        parsed.push((letters, ell));
    }
    // Labels: the ellipsis dims first, then letters in order of appearance.
    let mut letters: Vec<char> = Vec::new();
    let mut label = |c: char| match letters.iter().position(|&l| l == c) {
        Some(p) => ell_len + p,
        None => {
            letters.push(c);
            ell_len + letters.len() - 1
        }
    };
    let mut operands = Vec::new();
    for ((ls, ell), &r) in parsed.iter().zip(ranks) {
        let mut axes: Vec<usize> = Vec::with_capacity(r);
        let n_ell = r - ls.len();
        for (i, &c) in ls.iter().enumerate() {
            if *ell == Some(i) {
                axes.extend(ell_len - n_ell..ell_len);
            }
            axes.push(label(c));
        }
        if *ell == Some(ls.len()) {
            axes.extend(ell_len - n_ell..ell_len);
        }
        operands.push(axes);
    }
    let output = match rhs {
        Some(r) => {
            let (ls, ell) = parse(r)?;
            let mut out = Vec::new();
            for (i, &c) in ls.iter().enumerate() {
                if ell == Some(i) {
                    out.extend(0..ell_len);
                }
                let p = letters.iter().position(|&l| l == c).ok_or_else(|| {
                    format!("equation `{equation}`: output letter `{c}` is in no operand")
                })?;
                if out.contains(&(ell_len + p)) {
                    return Err(format!(
                        "equation `{equation}`: output letter `{c}` repeats"
                    ));
                }
                out.push(ell_len + p);
            }
            if ell == Some(ls.len()) {
                out.extend(0..ell_len);
            }
            out
        }
        None => {
            let mut once: Vec<char> = letters
                .iter()
                .copied()
                .filter(|&c| {
                    parsed
                        .iter()
                        .map(|(ls, _)| ls.iter().filter(|&&l| l == c).count())
                        .sum::<usize>()
                        == 1
                })
                .collect();
            once.sort_unstable();
            (0..ell_len)
                .chain(
                    once.iter()
                        .map(|c| ell_len + letters.iter().position(|l| l == c).expect("seen")),
                )
                .collect()
        }
    };
    Ok(EinsumPlan {
        operands,
        output,
        labels: ell_len + letters.len(),
    })
}
