//! The text front: tokenize with a Hugging Face `tokenizer.json`, run, pool sentence embeddings.
//!
//! The sentence-transformers pipeline of all-MiniLM-L6-v2 is: tokenize (truncate to 256 tokens
//! counting `[CLS]` and `[SEP]`, pad to the longest text of the batch), run the encoder, take the
//! mean of `last_hidden_state` over the positions where `attention_mask == 1`, L2-normalise.
//!
//! ```no_run
//! use runtime::text::{Padding, SentenceEncoder, Tokenizer, TokenizerOptions};
//! use runtime::{CompileOptions, Model, Session};
//! let tok = Tokenizer::from_file(
//!     "minilm-l6/tokenizer.json",
//!     TokenizerOptions { max_length: Some(256), padding: Padding::Longest },
//! )?;
//! let session = Session::new(&Model::load("minilm-l6/model.onnx")?, CompileOptions::default())?;
//! let enc = SentenceEncoder::new(session, tok);
//! let emb = enc.embed(&["A man is eating food.", "A man is riding a horse."])?;
//! assert_eq!(emb.shape(), &[2, 384]);
//! # Ok::<(), runtime::Error>(())
//! ```

use std::path::Path;
use std::sync::Arc;

use crate::{Error, Session, TensorValue};

/// How a batch is padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// To the longest sequence of the batch.
    Longest,
    /// To exactly this many tokens (longer texts are truncated to it).
    Fixed(usize),
}

/// Truncation and padding of a [`Tokenizer`]; they replace whatever `tokenizer.json` sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenizerOptions {
    /// Longest sequence in tokens, special tokens included; `None` keeps every token (a text
    /// longer than the model's positions then fails at run time with
    /// [`Error::SequenceTooLong`]).
    pub max_length: Option<usize>,
    pub padding: Padding,
}

impl Default for TokenizerOptions {
    /// 512 tokens (BERT's positions), padded to the longest text.
    fn default() -> Self {
        TokenizerOptions {
            max_length: Some(512),
            padding: Padding::Longest,
        }
    }
}

/// A batch of tokenized texts: `[batch, sequence]` i64 tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    pub input_ids: TensorValue,
    pub attention_mask: TensorValue,
    pub token_type_ids: TensorValue,
}

impl Encoded {
    /// The three tensors under the usual input names, restricted to those `session` takes
    /// (DistilBERT has no `token_type_ids`).
    pub fn feeds(&self, session: &Session) -> Vec<(&'static str, TensorValue)> {
        let names: Vec<String> = session.inputs().into_iter().map(|s| s.name).collect();
        [
            ("input_ids", &self.input_ids),
            ("attention_mask", &self.attention_mask),
            ("token_type_ids", &self.token_type_ids),
        ]
        .into_iter()
        .filter(|(n, _)| names.iter().any(|x| x == n))
        .map(|(n, t)| (n, t.clone()))
        .collect()
    }
}

/// A tokenizer read from a Hugging Face `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_length: Option<usize>,
    pad_id: u32,
}

/// One text (or text pair) tokenized and not padded: what a caller that forms its own batches
/// (a server's batcher) keeps per text, then joins with [`Tokenizer::batch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokens {
    /// Token ids, special tokens included.
    pub ids: Vec<u32>,
    /// Token types (1 on the second text of a pair).
    pub type_ids: Vec<u32>,
    /// Whether truncation to the tokenizer's `max_length` removed tokens.
    pub truncated: bool,
}

impl Tokens {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// One token of a text as [`Tokenizer::pieces`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenPiece {
    pub id: u32,
    /// The token's string in the vocabulary (`##ing`, `[CLS]`).
    pub token: String,
    /// Whether the post-processor added it (`[CLS]`, `[SEP]`).
    pub special: bool,
    /// Byte range in the text (empty for special tokens).
    pub start: usize,
    pub stop: usize,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads `tokenizer.json` and applies `opts` (the pad token and id come from the file's
    /// padding settings, else `[PAD]` / `<pad>` in its vocabulary, else id 0).
    pub fn from_file(path: impl AsRef<Path>, opts: TokenizerOptions) -> Result<Tokenizer, Error> {
        let path = path.as_ref();
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let (pad_id, pad_token) = match inner.get_padding() {
            Some(p) => (p.pad_id, p.pad_token.clone()),
            None => ["[PAD]", "<pad>"]
                .iter()
                .find_map(|t| inner.token_to_id(t).map(|id| (id, t.to_string())))
                .unwrap_or((0, "[PAD]".to_string())),
        };
        let max_length = match (opts.max_length, opts.padding) {
            (Some(m), Padding::Fixed(f)) => Some(m.min(f)),
            (None, Padding::Fixed(f)) => Some(f),
            (m, Padding::Longest) => m,
        };
        // tokenizers ignores a limit below its special tokens instead of failing: refuse it here.
        let specials = inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        if let Some(m) = max_length {
            if m <= specials {
                return Err(Error::Tokenizer(format!(
                    "max_length {m} leaves no room for text next to {specials} special tokens"
                )));
            }
        }
        match max_length {
            Some(max_length) => {
                inner
                    .with_truncation(Some(tokenizers::TruncationParams {
                        max_length,
                        ..Default::default()
                    }))
                    .map_err(tok_err)?;
            }
            None => {
                inner.with_truncation(None).map_err(tok_err)?;
            }
        }
        let strategy = match opts.padding {
            Padding::Longest => tokenizers::PaddingStrategy::BatchLongest,
            Padding::Fixed(n) => tokenizers::PaddingStrategy::Fixed(n),
        };
        inner.with_padding(Some(tokenizers::PaddingParams {
            strategy,
            pad_id,
            pad_type_id: 0,
            pad_token,
            ..Default::default()
        }));
        Ok(Tokenizer {
            inner,
            max_length,
            pad_id,
        })
    }

    /// The id of a token, if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Tokenizes single texts (token types 0).
    ///
    /// An empty list, or an empty or blank text, is [`Error::EmptyText`]: it would embed only
    /// `[CLS] [SEP]`, which is never what a caller meant.
    pub fn encode(&self, texts: &[&str]) -> Result<Encoded, Error> {
        check_texts(texts.iter().copied())?;
        let encs = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(tok_err)?;
        to_tensors(&encs)
    }

    /// Tokenizes text pairs (`[CLS] a [SEP] b [SEP]`, token type 1 on `b`).
    pub fn encode_pairs(&self, pairs: &[(&str, &str)]) -> Result<Encoded, Error> {
        check_texts(pairs.iter().flat_map(|(a, b)| [*a, *b]))?;
        self.check_pair_room()?;
        let inputs: Vec<tokenizers::EncodeInput> = pairs
            .iter()
            .map(|&(a, b)| tokenizers::EncodeInput::Dual(a.into(), b.into()))
            .collect();
        let encs = self.inner.encode_batch(inputs, true).map_err(tok_err)?;
        to_tensors(&encs)
    }

    /// The longest sequence it produces, special tokens included (`None`: no truncation).
    pub fn max_length(&self) -> Option<usize> {
        self.max_length
    }

    /// One text's tokens, unpadded, exactly as [`Tokenizer::encode`] gives that text's real
    /// (unmasked) positions in any batch. An empty or blank text is [`Error::EmptyText`].
    ///
    /// ```no_run
    /// use runtime::text::{Tokenizer, TokenizerOptions};
    /// let tok = Tokenizer::from_file("minilm-l6/tokenizer.json", TokenizerOptions::default())?;
    /// let (a, b) = (tok.tokenize("A short text.")?, tok.tokenize("A somewhat longer text.")?);
    /// let batch = tok.batch(&[&a, &b])?; // [2, longest] ids, mask and types
    /// assert_eq!(batch.input_ids.shape(), &[2, b.len()]);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn tokenize(&self, text: &str) -> Result<Tokens, Error> {
        check_texts(std::iter::once(text))?;
        let enc = self.inner.encode(text, true).map_err(tok_err)?;
        Ok(real_tokens(&enc))
    }

    /// A text pair's tokens (`[CLS] a [SEP] b [SEP]`), as [`Tokenizer::encode_pairs`] gives them.
    pub fn tokenize_pair(&self, a: &str, b: &str) -> Result<Tokens, Error> {
        self.check_pair_room()?;
        check_texts([a, b].into_iter())?;
        let enc = self
            .inner
            .encode(tokenizers::EncodeInput::Dual(a.into(), b.into()), true)
            .map_err(tok_err)?;
        Ok(real_tokens(&enc))
    }

    /// Texts tokenized one by one joined into one batch, padded to the longest with the pad id
    /// (mask 0, type 0): the same tensors [`Tokenizer::encode`] makes of those texts.
    pub fn batch(&self, texts: &[&Tokens]) -> Result<Encoded, Error> {
        if texts.is_empty() {
            return Err(Error::EmptyText { index: None });
        }
        let (b, s) = (
            texts.len(),
            texts.iter().map(|t| t.len()).max().unwrap_or(0),
        );
        let mut ids = vec![self.pad_id as i64; b * s];
        let mut mask = vec![0i64; b * s];
        let mut types = vec![0i64; b * s];
        for (r, t) in texts.iter().enumerate() {
            for (j, (&id, &ty)) in t.ids.iter().zip(&t.type_ids).enumerate() {
                ids[r * s + j] = id as i64;
                mask[r * s + j] = 1;
                types[r * s + j] = ty as i64;
            }
        }
        Ok(Encoded {
            input_ids: TensorValue::from_i64(vec![b, s], ids)?,
            attention_mask: TensorValue::from_i64(vec![b, s], mask)?,
            token_type_ids: TensorValue::from_i64(vec![b, s], types)?,
        })
    }

    /// The tokens of one text with their strings and byte offsets (a server's `/tokenize`).
    /// Unlike [`Tokenizer::tokenize`], an empty text gives just the special tokens.
    pub fn pieces(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenPiece>, Error> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tok_err)?;
        let mask = enc.get_attention_mask();
        Ok(enc
            .get_ids()
            .iter()
            .zip(enc.get_tokens())
            .zip(enc.get_special_tokens_mask())
            .zip(enc.get_offsets())
            .zip(mask)
            .filter(|(_, &m)| m != 0)
            .map(
                |((((&id, token), &special), &(start, stop)), _)| TokenPiece {
                    id,
                    token: token.clone(),
                    special: special != 0,
                    start,
                    stop,
                },
            )
            .collect())
    }

    /// Refuses a `max_length` that leaves no room for two texts beside the pair's special tokens.
    fn check_pair_room(&self) -> Result<(), Error> {
        let specials = self
            .inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, true));
        match self.max_length.filter(|&m| m <= specials + 1) {
            Some(m) => Err(Error::Tokenizer(format!(
                "max_length {m} leaves no room for two texts next to {specials} special tokens"
            ))),
            None => Ok(()),
        }
    }
}

/// The unmasked positions of one encoding (padding, if the tokenizer added any, dropped).
fn real_tokens(enc: &tokenizers::Encoding) -> Tokens {
    let mask = enc.get_attention_mask();
    let keep = |v: &[u32]| -> Vec<u32> {
        v.iter()
            .zip(mask)
            .filter(|(_, &m)| m != 0)
            .map(|(&x, _)| x)
            .collect()
    };
    Tokens {
        ids: keep(enc.get_ids()),
        type_ids: keep(enc.get_type_ids()),
        truncated: !enc.get_overflowing().is_empty(),
    }
}

fn check_texts<'a>(texts: impl Iterator<Item = &'a str>) -> Result<(), Error> {
    let mut n = 0;
    for (i, t) in texts.enumerate() {
        if t.trim().is_empty() {
            return Err(Error::EmptyText { index: Some(i) });
        }
        n += 1;
    }
    if n == 0 {
        return Err(Error::EmptyText { index: None });
    }
    Ok(())
}

fn to_tensors(encs: &[tokenizers::Encoding]) -> Result<Encoded, Error> {
    let b = encs.len();
    let s = encs.first().map_or(0, |e| e.get_ids().len());
    if encs.iter().any(|e| e.get_ids().len() != s) {
        return Err(Error::Tokenizer(
            "encodings of one batch differ in length".into(),
        ));
    }
    let grab = |f: &dyn Fn(&tokenizers::Encoding) -> &[u32]| -> Result<TensorValue, Error> {
        let v: Vec<i64> = encs
            .iter()
            .flat_map(|e| f(e).iter().map(|&x| x as i64))
            .collect();
        TensorValue::from_i64(vec![b, s], v)
    };
    Ok(Encoded {
        input_ids: grab(&|e| e.get_ids())?,
        attention_mask: grab(&|e| e.get_attention_mask())?,
        token_type_ids: grab(&|e| e.get_type_ids())?,
    })
}

/// Mean of `hidden` `[B, S, H]` over the positions where `mask` `[B, S]` is non-zero → `[B, H]`.
/// A row without any valid position gives zeros.
///
/// ```
/// use runtime::{text::mean_pool, TensorValue};
/// let h = TensorValue::from_f32(vec![1, 3, 2], vec![1., 2., 3., 4., 100., 100.]).unwrap();
/// let m = TensorValue::from_i64(vec![1, 3], vec![1, 1, 0]).unwrap();
/// assert_eq!(mean_pool(&h, &m).unwrap().as_f32().unwrap(), &[2., 3.]);
/// ```
pub fn mean_pool(hidden: &TensorValue, mask: &TensorValue) -> Result<TensorValue, Error> {
    let hv = hidden.typed::<f32>()?;
    if hidden.rank() != 3 || mask.shape() != &hidden.shape()[..2] {
        return Err(Error::Invalid(format!(
            "mean_pool: hidden {:?} and mask {:?} must be [B, S, H] and [B, S]",
            hidden.shape(),
            mask.shape()
        )));
    }
    let m = mask.to_f32_vec();
    let (b, s, h) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    let mut out = vec![0.0f32; b * h];
    for bi in 0..b {
        let row = &mut out[bi * h..(bi + 1) * h];
        let mut count = 0.0f32;
        for si in 0..s {
            let w = m[bi * s + si];
            if w != 0.0 {
                count += w;
                let x = &hv[(bi * s + si) * h..(bi * s + si + 1) * h];
                row.iter_mut().zip(x).for_each(|(r, &v)| *r += v * w);
            }
        }
        // As sentence-transformers: divide by the clamped count.
        let inv = 1.0 / count.max(1e-9);
        row.iter_mut().for_each(|r| *r *= inv);
    }
    TensorValue::from_f32(vec![b, h], out)
}

/// The first token's (`[CLS]`) vector of each sequence of `hidden` `[B, S, H]` → `[B, H]`.
///
/// ```
/// use runtime::{text::cls_pool, TensorValue};
/// let h = TensorValue::from_f32(vec![1, 2, 2], vec![1., 2., 3., 4.]).unwrap();
/// assert_eq!(cls_pool(&h).unwrap().as_f32().unwrap(), &[1., 2.]);
/// ```
pub fn cls_pool(hidden: &TensorValue) -> Result<TensorValue, Error> {
    let v = hidden.typed::<f32>()?;
    if hidden.rank() != 3 {
        return Err(Error::Invalid(format!(
            "cls_pool: hidden {:?} must be [B, S, H]",
            hidden.shape()
        )));
    }
    let (b, s, h) = (hidden.shape()[0], hidden.shape()[1], hidden.shape()[2]);
    let rows = (0..b)
        .flat_map(|i| v[i * s * h..i * s * h + h].iter().copied())
        .collect();
    TensorValue::from_f32(vec![b, h], rows)
}

/// Each row of a `[B, H]` tensor divided by its L2 norm (clamped at 1e-12).
///
/// ```
/// use runtime::{text::l2_normalize, TensorValue};
/// let x = TensorValue::from_f32(vec![1, 2], vec![3., 4.]).unwrap();
/// assert_eq!(l2_normalize(&x).unwrap().as_f32().unwrap(), &[0.6, 0.8]);
/// ```
pub fn l2_normalize(x: &TensorValue) -> Result<TensorValue, Error> {
    let v = x.typed::<f32>()?;
    if x.rank() != 2 {
        return Err(Error::Invalid(format!(
            "l2_normalize: expected [B, H], got {:?}",
            x.shape()
        )));
    }
    let h = x.shape()[1];
    let mut out = v.to_vec();
    if h > 0 {
        for row in out.chunks_exact_mut(h) {
            let norm = row
                .iter()
                .map(|&a| (a as f64) * (a as f64))
                .sum::<f64>()
                .sqrt() as f32;
            let inv = 1.0 / norm.max(1e-12);
            row.iter_mut().for_each(|a| *a *= inv);
        }
    }
    TensorValue::from_f32(x.shape().to_vec(), out)
}

/// Mean pooling then L2 normalisation: the sentence embedding of sentence-transformers.
pub fn sentence_embeddings(hidden: &TensorValue, mask: &TensorValue) -> Result<TensorValue, Error> {
    l2_normalize(&mean_pool(hidden, mask)?)
}

/// The output that holds the token states to pool: `last_hidden_state`, else the first output.
///
/// ```
/// use runtime::{CompileOptions, Model, Session};
/// let g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,S,2]\n%1 = relu(%0) : f32[B,S,2]\noutput \"h\" = %1\n",
///     None,
/// ).unwrap();
/// let s = Session::new(&Model::from_graph(g).unwrap(), CompileOptions::default()).unwrap();
/// assert_eq!(runtime::text::hidden_state_output(&s), "h");
/// ```
pub fn hidden_state_output(session: &Session) -> String {
    let names = session.output_names();
    names
        .iter()
        .find(|n| *n == "last_hidden_state")
        .or(names.first())
        .cloned()
        .unwrap_or_default()
}

/// How the token states `[B, S, H]` of a batch become one vector per text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the real tokens (sentence-transformers pooling): [`mean_pool`].
    #[default]
    Mean,
    /// The first token's (`[CLS]`) vector: [`cls_pool`].
    Cls,
}

impl Pooling {
    /// `hidden` `[B, S, H]` pooled into `[B, H]`; `mask` `[B, S]` marks the real tokens.
    ///
    /// ```
    /// use runtime::{text::Pooling, TensorValue};
    /// let h = TensorValue::from_f32(vec![1, 2, 1], vec![1., 3.]).unwrap();
    /// let m = TensorValue::from_i64(vec![1, 2], vec![1, 1]).unwrap();
    /// assert_eq!(Pooling::Mean.pool(&h, &m).unwrap().as_f32().unwrap(), &[2.]);
    /// assert_eq!(Pooling::Cls.pool(&h, &m).unwrap().as_f32().unwrap(), &[1.]);
    /// ```
    pub fn pool(self, hidden: &TensorValue, mask: &TensorValue) -> Result<TensorValue, Error> {
        if hidden.rank() != 3 {
            return Err(Error::Invalid(format!(
                "pooling needs a [batch, sequence, hidden] output, got {:?}",
                hidden.shape()
            )));
        }
        match self {
            Pooling::Mean => mean_pool(hidden, mask),
            Pooling::Cls => cls_pool(hidden),
        }
    }
}

/// Tokenizer + encoder session + pooling: texts in, sentence embeddings out (by default
/// mean-pooled and L2-normalised, as sentence-transformers).
///
/// Every text's row is the same whatever else shares its batch: the session runs the real
/// tokens only, so [`SentenceEncoder::embed_all`] may group texts by length freely.
pub struct SentenceEncoder {
    session: Arc<Session>,
    tokenizer: Arc<Tokenizer>,
    output: String,
    pooling: Pooling,
    normalize: bool,
}

impl SentenceEncoder {
    /// Mean-pools the session's [`hidden_state_output`] and normalises. The session and the
    /// tokenizer may be shared (`Arc`) with other users, such as encoders with other pooling
    /// or tokenizer threads.
    pub fn new(
        session: impl Into<Arc<Session>>,
        tokenizer: impl Into<Arc<Tokenizer>>,
    ) -> SentenceEncoder {
        let session = session.into();
        let output = hidden_state_output(&session);
        SentenceEncoder {
            session,
            tokenizer: tokenizer.into(),
            output,
            pooling: Pooling::Mean,
            normalize: true,
        }
    }

    /// Pools with `pooling` instead of the mean.
    pub fn with_pooling(mut self, pooling: Pooling) -> SentenceEncoder {
        self.pooling = pooling;
        self
    }

    /// Whether rows are L2-normalised (the default) or left as pooled.
    pub fn with_normalize(mut self, normalize: bool) -> SentenceEncoder {
        self.normalize = normalize;
        self
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// `[texts.len(), hidden]` embeddings of one batch.
    pub fn embed(&self, texts: &[&str]) -> Result<TensorValue, Error> {
        self.embed_encoded(&self.tokenizer.encode(texts)?)
    }

    /// [`SentenceEncoder::embed`] of texts already tokenized by [`Tokenizer::tokenize`].
    pub fn embed_tokens(&self, tokens: &[&Tokens]) -> Result<TensorValue, Error> {
        self.embed_encoded(&self.tokenizer.batch(tokens)?)
    }

    fn embed_encoded(&self, enc: &Encoded) -> Result<TensorValue, Error> {
        let hidden = self
            .session
            .run_output(&enc.feeds(&self.session), &self.output)?;
        let pooled = self.pooling.pool(&hidden, &enc.attention_mask);
        // The hidden state's buffer serves the session's next run.
        self.session.recycle(hidden);
        let pooled = pooled?;
        if self.normalize {
            l2_normalize(&pooled)
        } else {
            Ok(pooled)
        }
    }

    /// `[texts.len(), hidden]` embeddings of any number of texts, rows in `texts` order, run
    /// `batch_size` at a time in order of length (so a batch pads little); `progress` hears
    /// the number of texts of each batch done.
    ///
    /// ```no_run
    /// # use runtime::text::{Padding, SentenceEncoder, Tokenizer, TokenizerOptions};
    /// # use runtime::{CompileOptions, Model, Session};
    /// # let tok = Tokenizer::from_file("tokenizer.json", TokenizerOptions::default())?;
    /// # let session = Session::new(&Model::load("model.onnx")?, CompileOptions::default())?;
    /// let enc = SentenceEncoder::new(session, tok);
    /// let texts = vec!["a long text about food".to_string(), "short".to_string()];
    /// let emb = enc.embed_all(&texts, 32, |done| eprintln!("{done} more"))?;
    /// assert_eq!(emb.shape()[0], 2);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn embed_all<S: AsRef<str>>(
        &self,
        texts: &[S],
        batch_size: usize,
        mut progress: impl FnMut(usize),
    ) -> Result<TensorValue, Error> {
        if texts.is_empty() {
            return Err(Error::EmptyText { index: None });
        }
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].as_ref().len());
        let mut width = 0;
        let mut rows = Vec::new();
        for chunk in order.chunks(batch_size.max(1)) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i].as_ref()).collect();
            let e = self.embed(&batch)?;
            let h = e.shape()[1];
            if rows.is_empty() {
                width = h;
                rows = vec![0.0f32; texts.len() * h];
            }
            let v = e.typed::<f32>()?;
            for (r, &i) in chunk.iter().enumerate() {
                rows[i * h..(i + 1) * h].copy_from_slice(&v[r * h..(r + 1) * h]);
            }
            progress(chunk.len());
        }
        TensorValue::from_f32(vec![texts.len(), width], rows)
    }
}
