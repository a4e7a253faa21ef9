//! `encore serve`: the model behind HTTP, with text-embeddings-inference's routes and OpenAI's
//! `/v1/embeddings`, dynamic batching, back-pressure and graceful shutdown.
//!
//! The listener is bound before the model loads, so that `/health` answers 503 (not a refused
//! connection) while it compiles. Requests are admitted up to `--max-concurrent-requests`
//! (429 beyond); their texts are tokenized on `--tokenization-workers` threads and batched by
//! [`engine`]. On SIGINT or SIGTERM the server stops accepting connections, answers new
//! requests on open ones with 503, finishes every accepted request, then exits.

mod api;
mod engine;
mod metrics;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use clap::Args;
use tokio::sync::{oneshot, Semaphore};

use crate::commands::embed::Pooling;
use crate::error::CliError;
use api::AppState;
use engine::{Engine, LoadOptions};
use metrics::Metrics;

#[derive(Args)]
pub struct ServeArgs {
    /// The model (ONNX, or a compiled `.encore` from `encore quantize`).
    #[arg(long)]
    model: PathBuf,
    /// A `tokenizer.json` (Hugging Face tokenizers format).
    #[arg(long)]
    tokenizer: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the one chosen is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Token budget of one batch: texts × longest text of the batch.
    #[arg(long, default_value_t = 16384)]
    max_batch_tokens: usize,
    /// Requests held at once (being tokenized, queued or running); more get 429.
    #[arg(long, default_value_t = 512)]
    max_concurrent_requests: usize,
    /// Most inputs in one request; more get 413.
    #[arg(long, default_value_t = 32)]
    max_client_batch_size: usize,
    /// Session worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Threads that tokenize (default: every core).
    #[arg(long)]
    tokenization_workers: Option<usize>,
    /// Longest input in tokens, special tokens included (default: 512, or the model's positions
    /// if fewer). Longer inputs get 413 unless the request says `truncate: true`.
    #[arg(long)]
    max_input_length: Option<usize>,
    /// How token states become one embedding per text.
    #[arg(long, value_enum, default_value = "mean")]
    pooling: Pooling,
    /// The model's name in `/info` and in OpenAI responses (default: the model file's stem).
    #[arg(long)]
    model_id: Option<String>,
    /// A Hugging Face `config.json` whose `id2label` names a classifier's labels (default: the
    /// `config.json` beside the model, if any).
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: ServeArgs) -> Result<(), CliError> {
    for (name, v) in [
        ("--max-batch-tokens", args.max_batch_tokens),
        ("--max-concurrent-requests", args.max_concurrent_requests),
        ("--max-client-batch-size", args.max_client_batch_size),
    ] {
        if v == 0 {
            return Err(CliError::usage(name, "must be at least 1"));
        }
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(4))
        .thread_name("encore-http")
        .enable_all()
        .build()
        .map_err(|source| CliError::Io {
            path: PathBuf::from("tokio runtime"),
            source,
        })?;
    rt.block_on(serve(args, cores))
}

async fn serve(args: ServeArgs, cores: usize) -> Result<(), CliError> {
    let bind = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|source| CliError::Io {
            path: PathBuf::from(&bind),
            source,
        })?;
    let addr: SocketAddr = listener.local_addr().map_err(|source| CliError::Io {
        path: PathBuf::from(&bind),
        source,
    })?;
    eprintln!(
        "encore serve: listening on http://{addr}, loading {}",
        args.model.display()
    );
    let metrics = Arc::new(Metrics::new());
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        args.model
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    });
    let state = Arc::new(AppState {
        engine: OnceLock::new(),
        metrics: metrics.clone(),
        permits: Semaphore::new(args.max_concurrent_requests),
        max_concurrent_requests: args.max_concurrent_requests,
        max_client_batch_size: args.max_client_batch_size,
        model_id,
        stopping: AtomicBool::new(false),
    });

    let opts = LoadOptions {
        model: args.model.clone(),
        tokenizer: args.tokenizer.clone(),
        config: args.config.clone(),
        threads: args.threads,
        tokenization_workers: args.tokenization_workers.unwrap_or(cores).max(1),
        max_input_length: args.max_input_length,
        max_batch_tokens: args.max_batch_tokens,
        pooling: args.pooling,
    };
    let (loaded_tx, loaded_rx) = oneshot::channel();
    let loading = state.clone();
    std::thread::Builder::new()
        .name("encore-load".into())
        .spawn(move || {
            let start = Instant::now();
            let result = Engine::load(&opts, metrics).map(|engine| {
                let _ = loading.engine.set(Arc::new(engine));
                start.elapsed()
            });
            let _ = loaded_tx.send(result);
        })
        .map_err(|source| CliError::Io {
            path: PathBuf::from("loader thread"),
            source,
        })?;

    let app = api::router(state.clone());
    let stopping = state.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                stopping.stopping.store(true, Ordering::Relaxed);
                eprintln!("encore serve: shutting down, finishing accepted requests");
            })
            .await
    });

    match loaded_rx.await {
        Ok(Ok(took)) => eprintln!("encore serve: ready in {:.2} s", took.as_secs_f64()),
        Ok(Err(e)) => {
            server.abort();
            return Err(e);
        }
        Err(_) => {
            server.abort();
            return Err(CliError::usage("--model", "the loader thread failed"));
        }
    }
    let served = server.await;
    if let Some(engine) = state.engine.get().cloned() {
        let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
    }
    match served {
        Ok(Ok(())) => {
            eprintln!("encore serve: stopped");
            Ok(())
        }
        Ok(Err(source)) => Err(CliError::Io {
            path: PathBuf::from(addr.to_string()),
            source,
        }),
        Err(e) => Err(CliError::usage(
            "serve",
            format!("the server task failed: {e}"),
        )),
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (what `kill` and Kubernetes send).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
