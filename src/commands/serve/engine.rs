//! The model side of the server: tokenization on its own threads, one queue of texts, and a
//! batcher thread that forms batches by a token budget and runs them through the session.
//!
//! A request's texts are tokenized by the [`TokenizerPool`], queued one job per text, and
//! answered when every job has its row. The batcher drains the queue, sorts what it took by
//! length (so that a batch groups similar lengths), cuts it into batches whose padded size
//! stays within `max_batch_tokens`, and runs them one after another with every session thread.
//! The session computes each text's real tokens only (padding-free) and its rows do not depend
//! on what else is in the batch, so a text's answer is bit-identical to `encore embed`'s
//! whatever it was batched with.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use runtime::text::{Padding, SentenceEncoder, Tokenizer, TokenizerOptions, Tokens};
use runtime::{Model, Session};
use tokio::sync::oneshot;

use super::api::ApiError;
use super::metrics::Metrics;
use crate::commands::embed::Pooling;
use crate::error::CliError;

/// What the model's output is used for.
#[derive(Clone, Debug)]
pub enum Task {
    /// Token states `[B, S, H]` pooled into one vector per text (`/embed`, `/v1/embeddings`).
    Embedding {
        pooling: Pooling,
        dim: Option<usize>,
    },
    /// One row of logits `[B, labels]` per text (`/predict`).
    Classifier { labels: Vec<String> },
}

/// One text of the batch or a text pair.
#[derive(Clone, Debug)]
pub enum Sequence {
    Text(String),
    Pair(String, String),
}

/// How the server loads its model.
pub struct LoadOptions {
    pub model: PathBuf,
    pub tokenizer: PathBuf,
    /// `config.json` with `id2label`, for classifiers.
    pub config: Option<PathBuf>,
    pub threads: Option<usize>,
    pub tokenization_workers: usize,
    pub max_input_length: Option<usize>,
    pub max_batch_tokens: usize,
    pub pooling: Pooling,
}

/// The loaded model: what the HTTP side asks for texts and rows.
pub struct Engine {
    pub task: Task,
    /// Longest text in tokens, special tokens included.
    pub max_input_length: usize,
    pub max_batch_tokens: usize,
    pub tokenization_workers: usize,
    /// `int8` or `float32`.
    pub dtype: &'static str,
    pool: TokenizerPool,
    batcher: Batcher,
}

impl Engine {
    /// Loads and compiles the model, starts the tokenizer threads and the batcher.
    pub fn load(opts: &LoadOptions, metrics: Arc<Metrics>) -> Result<Engine, CliError> {
        let model = Model::load(&opts.model)?;
        let dtype = if model.is_quantized() {
            "int8"
        } else {
            "float32"
        };
        let task = task_of(&model, opts)?;
        let session = Session::new(&model, super::super::compile_options(opts.threads))?;
        drop(model);
        let positions = session.max_sequence_length().unwrap_or(usize::MAX);
        let max_input_length = opts.max_input_length.unwrap_or(512).min(positions);
        if max_input_length > opts.max_batch_tokens {
            return Err(CliError::usage(
                "--max-batch-tokens",
                format!(
                    "{} is smaller than the longest input ({max_input_length} tokens): such a text could never run",
                    opts.max_batch_tokens
                ),
            ));
        }
        let tokenizer = Arc::new(Tokenizer::from_file(
            &opts.tokenizer,
            TokenizerOptions {
                max_length: Some(max_input_length),
                padding: Padding::Longest,
            },
        )?);
        let model = match &task {
            // Rows are normalised per request (`normalize` of /embed), so pooled here only.
            Task::Embedding { pooling, .. } => RunnerModel::Embedding(
                SentenceEncoder::new(session, tokenizer.clone())
                    .with_pooling((*pooling).into())
                    .with_normalize(false),
            ),
            Task::Classifier { .. } => RunnerModel::Classifier {
                output: classifier_output(&session).unwrap_or_default(),
                session: Arc::new(session),
                tokenizer: tokenizer.clone(),
            },
        };
        let runner = Runner { model, metrics };
        Ok(Engine {
            task,
            max_input_length,
            max_batch_tokens: opts.max_batch_tokens,
            tokenization_workers: opts.tokenization_workers,
            dtype,
            pool: TokenizerPool::start(tokenizer, opts.tokenization_workers),
            batcher: Batcher::start(runner, opts.max_batch_tokens),
        })
    }

    /// Tokenizes `inputs` on the tokenizer threads. Without `truncate`, a text longer than
    /// [`Engine::max_input_length`] is refused (413); with it, it is cut to that length.
    pub async fn tokenize(
        &self,
        inputs: Vec<Sequence>,
        truncate: bool,
    ) -> Result<Vec<Tokens>, ApiError> {
        let max = self.max_input_length;
        self.pool
            .run(move |tok| {
                inputs
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let t = match s {
                            Sequence::Text(t) => tok.tokenize(t),
                            Sequence::Pair(a, b) => tok.tokenize_pair(a, b),
                        }
                        .map_err(|e| match e {
                            runtime::Error::EmptyText { .. } => {
                                ApiError::validation(format!("input {i} is empty"))
                            }
                            e => ApiError::tokenizer(format!("input {i}: {e}")),
                        })?;
                        if t.truncated && !truncate {
                            return Err(ApiError::too_large(format!(
                                "input {i} is longer than {max} tokens; send `truncate: true` to cut it"
                            )));
                        }
                        Ok(t)
                    })
                    .collect()
            })
            .await?
    }

    /// The pieces of each text for `/tokenize`.
    pub async fn pieces(
        &self,
        texts: Vec<String>,
        add_special_tokens: bool,
    ) -> Result<Vec<Vec<runtime::text::TokenPiece>>, ApiError> {
        self.pool
            .run(move |tok| {
                texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        tok.pieces(t, add_special_tokens)
                            .map_err(|e| ApiError::tokenizer(format!("input {i}: {e}")))
                    })
                    .collect()
            })
            .await?
    }

    /// The model's row for each text (pooled embedding or logits), in order.
    pub async fn infer(
        &self,
        texts: Vec<Tokens>,
        metrics: &Metrics,
    ) -> Result<Vec<Vec<f32>>, ApiError> {
        let mut replies = Vec::with_capacity(texts.len());
        let mut jobs = Vec::with_capacity(texts.len());
        let now = Instant::now();
        for tokens in texts {
            let (tx, rx) = oneshot::channel();
            replies.push(rx);
            jobs.push(Job {
                tokens,
                enqueued: now,
                reply: tx,
            });
        }
        self.batcher.submit(jobs, metrics)?;
        let mut rows = Vec::with_capacity(replies.len());
        for rx in replies {
            let row = rx
                .await
                .map_err(|_| ApiError::unavailable("the batcher stopped"))?
                .map_err(ApiError::backend)?;
            rows.push(row);
        }
        Ok(rows)
    }

    /// Whether the batcher thread is alive.
    pub fn healthy(&self) -> bool {
        self.batcher.alive()
    }

    /// Finishes every queued text, then stops the batcher and the tokenizer threads.
    pub fn shutdown(&self) {
        self.batcher.shutdown();
        self.pool.shutdown();
    }
}

/// Embedding when the model has token states to pool; classifier when it only has `[B, labels]`.
fn task_of(model: &Model, opts: &LoadOptions) -> Result<Task, CliError> {
    let outputs = model.outputs();
    let rank = |name: &str| {
        outputs
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.ty.shape.as_ref().map(|s| s.len()))
    };
    let last_dim = |name: &str| {
        outputs
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.ty.shape.as_ref()?.last()?.as_fixed())
    };
    let hidden = outputs
        .iter()
        .find(|o| o.name == "last_hidden_state")
        .or_else(|| outputs.iter().find(|o| rank(&o.name) == Some(3)));
    if let Some(h) = hidden {
        return Ok(Task::Embedding {
            pooling: opts.pooling,
            dim: last_dim(&h.name),
        });
    }
    let Some(logits) = outputs
        .iter()
        .find(|o| o.name == "logits")
        .or_else(|| outputs.iter().find(|o| rank(&o.name) == Some(2)))
    else {
        return Err(CliError::usage(
            "--model",
            format!(
                "serving needs token states [batch, sequence, hidden] to embed or logits [batch, labels] to classify; the outputs are {:?}",
                model.output_names()
            ),
        ));
    };
    let n = last_dim(&logits.name).ok_or_else(|| {
        CliError::usage(
            "--model",
            format!(
                "the number of labels of output `{}` is not fixed",
                logits.name
            ),
        )
    })?;
    Ok(Task::Classifier {
        labels: labels(opts.config.as_deref(), &opts.model, n)?,
    })
}

/// `id2label` of the `config.json` given, or beside the model; `LABEL_i` otherwise.
fn labels(
    config: Option<&std::path::Path>,
    model: &std::path::Path,
    n: usize,
) -> Result<Vec<String>, CliError> {
    let beside = model.with_file_name("config.json");
    let path = match config {
        Some(p) => Some(p.to_path_buf()),
        None => beside.is_file().then_some(beside),
    };
    let mut out: Vec<String> = (0..n).map(|i| format!("LABEL_{i}")).collect();
    let Some(path) = path else { return Ok(out) };
    let text = std::fs::read_to_string(&path).map_err(|source| CliError::Io {
        path: path.clone(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::usage("--config", format!("{}: {e}", path.display())))?;
    if let Some(map) = json.get("id2label").and_then(|m| m.as_object()) {
        for (k, v) in map {
            if let (Ok(i), Some(name)) = (k.parse::<usize>(), v.as_str()) {
                if i < n {
                    out[i] = name.to_string();
                }
            }
        }
    }
    Ok(out)
}

/// The classifier's logits: `logits`, else the first rank-2 output.
fn classifier_output(session: &Session) -> Option<String> {
    let names = session.output_names();
    names
        .iter()
        .find(|n| *n == "logits")
        .or(names.first())
        .cloned()
}

/// One text waiting for its row.
struct Job {
    tokens: Tokens,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Vec<f32>, String>>,
}

/// The session and what turns its outputs into rows; owned by the batcher thread.
struct Runner {
    model: RunnerModel,
    metrics: Arc<Metrics>,
}

/// What the batcher runs: pooled embeddings, or the logits output of a classifier.
enum RunnerModel {
    Embedding(SentenceEncoder),
    Classifier {
        session: Arc<Session>,
        tokenizer: Arc<Tokenizer>,
        output: String,
    },
}

impl Runner {
    /// Runs one batch and answers its jobs. When the batch fails, each text is run alone, so
    /// that one bad text fails only its own request.
    fn run(&self, jobs: Vec<Job>) {
        let start = Instant::now();
        for j in &jobs {
            self.metrics
                .queue_seconds
                .observe(start.duration_since(j.enqueued).as_secs_f64());
        }
        let tokens: Vec<&Tokens> = jobs.iter().map(|j| &j.tokens).collect();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.rows(&tokens)))
            .unwrap_or_else(|_| Err("internal error: the model run panicked".to_string()));
        match result {
            Ok(rows) => {
                let real: usize = tokens.iter().map(|t| t.len()).sum();
                let secs = start.elapsed().as_secs_f64();
                let m = &self.metrics;
                m.batch_texts.observe(jobs.len() as f64);
                m.batch_tokens.observe(real as f64);
                m.batch_seconds.observe(secs);
                m.texts.inc_by(jobs.len() as u64);
                m.tokens.inc_by(real as u64);
                if secs > 0.0 {
                    m.last_batch_tokens_per_second.set(real as f64 / secs);
                }
                for (job, row) in jobs.into_iter().zip(rows) {
                    // A client that went away dropped its receiver: nothing to answer.
                    let _ = job.reply.send(Ok(row));
                }
            }
            Err(_) if jobs.len() > 1 => {
                for job in jobs {
                    self.run(vec![job]);
                }
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
        }
    }

    fn rows(&self, tokens: &[&Tokens]) -> Result<Vec<Vec<f32>>, String> {
        let rows = match &self.model {
            RunnerModel::Embedding(encoder) => encoder.embed_tokens(tokens),
            RunnerModel::Classifier {
                session,
                tokenizer,
                output,
            } => tokenizer
                .batch(tokens)
                .and_then(|enc| session.run_output(&enc.feeds(session), output)),
        }
        .map_err(|e| e.to_string())?;
        let v = rows.typed::<f32>().map_err(|e| e.to_string())?;
        if rows.rank() != 2 || rows.shape()[0] != tokens.len() {
            return Err(format!(
                "expected one row per text ({}), got shape {:?}",
                tokens.len(),
                rows.shape()
            ));
        }
        let w = rows.shape()[1];
        Ok(v.chunks_exact(w.max(1)).map(<[f32]>::to_vec).collect())
    }
}

/// The queue between the HTTP side and the batcher thread.
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

struct QueueState {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// The batcher thread and its queue.
struct Batcher {
    queue: Arc<Queue>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Batcher {
    fn start(runner: Runner, max_batch_tokens: usize) -> Batcher {
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
        });
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("encore-batcher".into())
            .spawn(move || batch_loop(&q, &runner, max_batch_tokens))
            .expect("spawning the batcher thread");
        Batcher {
            queue,
            thread: Mutex::new(Some(thread)),
        }
    }

    fn submit(&self, jobs: Vec<Job>, metrics: &Metrics) -> Result<(), ApiError> {
        // A batcher that died (a panic outside the guarded model run) would leave jobs unanswered.
        if !self.alive() {
            return Err(ApiError::unavailable("the batcher stopped"));
        }
        let mut st = self.queue.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.closed {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        metrics.queue_depth.inc_by(jobs.len() as i64);
        st.jobs.extend(jobs);
        drop(st);
        self.queue.ready.notify_one();
        Ok(())
    }

    fn alive(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Closes the queue; the thread finishes what it holds and exits.
    fn shutdown(&self) {
        self.queue
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed = true;
        self.queue.ready.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Takes everything queued, runs it in length-sorted batches within the token budget, repeats;
/// returns once the queue is closed and empty.
fn batch_loop(queue: &Queue, runner: &Runner, max_batch_tokens: usize) {
    loop {
        let mut taken: Vec<Job> = {
            let mut st = queue.state.lock().unwrap_or_else(|p| p.into_inner());
            while st.jobs.is_empty() && !st.closed {
                st = queue.ready.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.jobs.is_empty() {
                return;
            }
            st.jobs.drain(..).collect()
        };
        runner.metrics.queue_depth.dec_by(taken.len() as i64);
        // Stable: texts of equal length keep their arrival order.
        taken.sort_by_key(|j| j.tokens.len());
        for batch in cut_batches(taken, max_batch_tokens) {
            runner.run(batch);
        }
    }
}

/// Consecutive runs of length-sorted jobs whose padded size (texts × longest) stays within
/// `budget` tokens; a run always holds at least one job.
fn cut_batches(sorted: Vec<Job>, budget: usize) -> Vec<Vec<Job>> {
    let mut out: Vec<Vec<Job>> = Vec::new();
    let mut cur: Vec<Job> = Vec::new();
    for job in sorted {
        let longest = job
            .tokens
            .len()
            .max(cur.last().map_or(0, |j| j.tokens.len()));
        if !cur.is_empty() && (cur.len() + 1) * longest > budget {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(job);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

type PoolTask = Box<dyn FnOnce(&Tokenizer) + Send>;

/// Threads that tokenize, so that neither the async workers nor the batcher do.
struct TokenizerPool {
    tx: Mutex<Option<mpsc::Sender<PoolTask>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl TokenizerPool {
    fn start(tokenizer: Arc<Tokenizer>, workers: usize) -> TokenizerPool {
        let (tx, rx) = mpsc::channel::<PoolTask>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..workers.max(1))
            .map(|i| {
                let (rx, tok) = (rx.clone(), tokenizer.clone());
                std::thread::Builder::new()
                    .name(format!("encore-tokenizer-{i}"))
                    .spawn(move || loop {
                        let task = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        match task {
                            Ok(task) => task(&tok),
                            Err(_) => return,
                        }
                    })
                    .expect("spawning a tokenizer thread")
            })
            .collect();
        TokenizerPool {
            tx: Mutex::new(Some(tx)),
            workers: Mutex::new(workers),
        }
    }

    /// Runs `f` on a tokenizer thread and waits for it without blocking the async worker.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Tokenizer) -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        let task: PoolTask = Box::new(move |tok| {
            let _ = tx.send(f(tok));
        });
        {
            let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            let sender = guard
                .as_ref()
                .ok_or_else(|| ApiError::unavailable("the server is shutting down"))?;
            sender
                .send(task)
                .map_err(|_| ApiError::unavailable("the tokenizer threads stopped"))?;
        }
        rx.await
            .map_err(|_| ApiError::backend("a tokenizer thread failed".to_string()))
    }

    fn shutdown(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        for w in self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(len: usize) -> Job {
        let (reply, _) = oneshot::channel();
        Job {
            tokens: Tokens {
                ids: vec![1; len],
                type_ids: vec![0; len],
                truncated: false,
            },
            enqueued: Instant::now(),
            reply,
        }
    }

    #[test]
    fn batches_stay_within_the_padded_token_budget() {
        let lens = [3, 3, 4, 10, 10, 10, 30, 64];
        let batches = cut_batches(lens.iter().map(|&l| job(l)).collect(), 32);
        let sizes: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().map(|j| j.tokens.len()).collect())
            .collect();
        // 3,3,4 pad to 4 (12 tokens), one more 10 would make 40; 10,10,10 is 30; 30 alone; 64
        // exceeds the budget alone and still runs, by itself.
        assert_eq!(
            sizes,
            vec![vec![3, 3, 4], vec![10, 10, 10], vec![30], vec![64]]
        );
    }
}
