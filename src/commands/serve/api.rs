//! The HTTP routes: text-embeddings-inference's (`/embed`, `/predict`, `/tokenize`, `/info`,
//! `/health`, `/metrics`) and OpenAI's `/v1/embeddings`.
//!
//! Every error is JSON with the status a client expects: 413 for too many inputs or a text
//! longer than the model takes (without `truncate`), 422 for a body that is not what the route
//! takes, 429 when the server already holds `--max-concurrent-requests`, 503 while the model
//! loads or after shutdown began, 500 when the model run itself fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Semaphore;

use super::engine::{Engine, Sequence, Task};
use super::metrics::Metrics;

/// Largest request body accepted (a client batch of long texts fits many times over).
const MAX_BODY_BYTES: usize = 8 << 20;

/// What the handlers share.
pub struct AppState {
    /// Set once the model has loaded; until then every model route answers 503.
    pub engine: OnceLock<Arc<Engine>>,
    pub metrics: Arc<Metrics>,
    /// Admission: one permit per request in flight.
    pub permits: Semaphore,
    pub max_concurrent_requests: usize,
    pub max_client_batch_size: usize,
    pub model_id: String,
    /// Set when shutdown begins: new requests get 503.
    pub stopping: AtomicBool,
}

/// An error response: TEI's `{"error", "error_type"}` body, or OpenAI's
/// `{"error": {"message", "type", "code"}}` on `/v1` routes.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    openai: bool,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            openai: false,
        }
    }

    /// 422: the body parses but is not valid for the route (empty text, wrong field type).
    pub fn validation(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Validation", message)
    }

    /// 413: too many inputs, a text too long, a body too large.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "Validation", message)
    }

    /// 422: the tokenizer refused a text.
    pub fn tokenizer(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Tokenizer", message)
    }

    /// 429: the server holds as many requests as it admits.
    pub fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "Overloaded", message)
    }

    /// 503: loading, or shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Unhealthy", message)
    }

    /// 500: the model run failed.
    pub fn backend(message: String) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "Backend", message)
    }

    fn not_found(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {path}"),
        )
    }

    fn openai(mut self) -> ApiError {
        self.openai = true;
        self
    }

    #[cfg(test)]
    fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = if self.openai {
            json!({"error": {"message": self.message, "type": self.kind, "code": self.status.as_u16()}})
        } else {
            json!({"error": self.message, "error_type": self.kind})
        };
        (self.status, Json(body)).into_response()
    }
}

/// A body that failed to parse: 413 when it was too large, 422 otherwise.
fn rejection(r: JsonRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::too_large(format!("request body larger than {MAX_BODY_BYTES} bytes"));
    }
    ApiError::validation(r.body_text())
}

/// `inputs` of `/embed`: one text or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(t) => vec![t],
            Texts::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbedRequest {
    inputs: Texts,
    #[serde(default = "yes")]
    normalize: bool,
    #[serde(default)]
    truncate: bool,
    /// Accepted for TEI compatibility: only `Right` (the tokenizer's) is supported.
    #[serde(default)]
    truncation_direction: Option<String>,
    /// Accepted for TEI compatibility; ignored (no prompt templates).
    #[serde(default)]
    prompt_name: Option<String>,
}

fn yes() -> bool {
    true
}

/// `inputs` of `/predict`: a text, a pair, or a list of either.
#[derive(Deserialize)]
#[serde(untagged)]
enum PredictInput {
    One(String),
    Pair([String; 2]),
    Many(Vec<PredictItem>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PredictItem {
    Text(String),
    Pair([String; 2]),
    Single([String; 1]),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PredictRequest {
    inputs: PredictInput,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    truncate: bool,
    #[serde(default)]
    truncation_direction: Option<String>,
}

#[derive(Serialize)]
struct Prediction {
    score: f32,
    label: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    inputs: Texts,
    #[serde(default = "yes")]
    add_special_tokens: bool,
}

#[derive(Serialize)]
struct Piece {
    id: u32,
    text: String,
    special: bool,
    start: Option<usize>,
    stop: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OpenAiInput {
    One(String),
    Many(Vec<String>),
    /// Token id arrays or anything else: refused with a clear message.
    Other(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct OpenAiRequest {
    input: OpenAiInput,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    /// OpenAI's end-user id: accepted, unused.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/embed", post(embed))
        .route("/predict", post(predict))
        .route("/tokenize", post(tokenize))
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/info", get(info))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|uri: axum::http::Uri| async move { ApiError::not_found(uri.path()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// A request admitted: its permit is returned when this is dropped.
struct Admitted<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    engine: Arc<Engine>,
}

impl AppState {
    /// The engine and a permit, or why the request cannot be taken now.
    fn admit(&self) -> Result<Admitted<'_>, ApiError> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        let engine = self
            .engine
            .get()
            .cloned()
            .ok_or_else(|| ApiError::unavailable("the model is loading"))?;
        let permit = self.permits.try_acquire().map_err(|_| {
            ApiError::overloaded(format!(
                "the server already holds {} requests (--max-concurrent-requests)",
                self.max_concurrent_requests
            ))
        })?;
        Ok(Admitted {
            _permit: permit,
            engine,
        })
    }

    fn check_batch(&self, n: usize) -> Result<(), ApiError> {
        if n == 0 {
            return Err(ApiError::validation("`inputs` cannot be empty"));
        }
        if n > self.max_client_batch_size {
            return Err(ApiError::too_large(format!(
                "{n} inputs in one request; the most is {} (--max-client-batch-size)",
                self.max_client_batch_size
            )));
        }
        Ok(())
    }

    /// Runs `work` as route `route`: in-flight gauge, request counter and latency histogram.
    async fn observed<F, T>(&self, route: &'static str, work: F) -> Response
    where
        F: std::future::Future<Output = Result<T, ApiError>>,
        T: IntoResponse,
    {
        let start = Instant::now();
        self.metrics.in_flight.inc();
        let response = match work.await {
            Ok(r) => r.into_response(),
            Err(e) => e.into_response(),
        };
        self.metrics.in_flight.dec();
        self.metrics.observe_request(
            route,
            response.status().as_u16(),
            start.elapsed().as_secs_f64(),
        );
        response
    }
}

fn check_right(direction: &Option<String>) -> Result<(), ApiError> {
    match direction.as_deref() {
        None | Some("right" | "Right") => Ok(()),
        Some(d) => Err(ApiError::validation(format!(
            "truncation_direction `{d}` is not supported (only Right)"
        ))),
    }
}

/// Embeddings of `texts`, L2-normalised when asked; checks that the model embeds.
async fn embeddings(
    state: &AppState,
    texts: Vec<String>,
    normalize: bool,
    truncate: bool,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    state.check_batch(texts.len())?;
    let ad = state.admit()?;
    if let Task::Classifier { .. } = ad.engine.task {
        return Err(ApiError::validation(
            "this model is a classifier: use /predict",
        ));
    }
    let seqs = texts.into_iter().map(Sequence::Text).collect();
    let tokens = ad.engine.tokenize(seqs, truncate).await?;
    let count: usize = tokens.iter().map(|t| t.len()).sum();
    let mut rows = ad.engine.infer(tokens, &state.metrics).await?;
    if normalize {
        for row in &mut rows {
            normalize_row(row)?;
        }
    }
    Ok((rows, count))
}

/// The row divided by its norm, by the same code as `encore embed --normalize`.
fn normalize_row(row: &mut Vec<f32>) -> Result<(), ApiError> {
    let t = runtime::TensorValue::from_f32(vec![1, row.len()], std::mem::take(row))
        .and_then(|t| runtime::text::l2_normalize(&t))
        .map_err(|e| ApiError::backend(e.to_string()))?;
    *row = t
        .typed::<f32>()
        .map_err(|e| ApiError::backend(e.to_string()))?
        .to_vec();
    Ok(())
}

async fn embed(
    State(state): State<Arc<AppState>>,
    body: Result<Json<EmbedRequest>, JsonRejection>,
) -> Response {
    let work = async {
        let Json(req) = body.map_err(rejection)?;
        check_right(&req.truncation_direction)?;
        let _ = req.prompt_name;
        let (rows, _) =
            embeddings(&state, req.inputs.into_vec(), req.normalize, req.truncate).await?;
        Ok::<_, ApiError>(Json(rows))
    };
    state.observed("/embed", work).await
}

async fn openai_embeddings(
    State(state): State<Arc<AppState>>,
    body: Result<Json<OpenAiRequest>, JsonRejection>,
) -> Response {
    let work = async {
        let Json(req) = body.map_err(rejection)?;
        let texts = match req.input {
            OpenAiInput::One(t) => vec![t],
            OpenAiInput::Many(v) => v,
            OpenAiInput::Other(_) => return Err(ApiError::validation(
                "`input` must be a string or a list of strings (token arrays are not supported)",
            )),
        };
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(f) => {
                return Err(ApiError::validation(format!(
                    "encoding_format `{f}`: expected `float` or `base64`"
                )))
            }
        };
        let (rows, tokens) = embeddings(&state, texts, true, false).await?;
        if let Some(d) = req.dimensions {
            if rows.first().is_some_and(|r| r.len() != d) {
                return Err(ApiError::validation(format!(
                    "dimensions {d}: this model gives {} (no Matryoshka truncation)",
                    rows[0].len()
                )));
            }
        }
        let data: Vec<serde_json::Value> = rows
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = row.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    json!(row)
                };
                json!({"object": "embedding", "embedding": embedding, "index": i})
            })
            .collect();
        Ok(Json(json!({
            "object": "list",
            "data": data,
            "model": req.model.unwrap_or_else(|| state.model_id.clone()),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        })))
    };
    let work = async { work.await.map_err(ApiError::openai) };
    state.observed("/v1/embeddings", work).await
}

async fn predict(
    State(state): State<Arc<AppState>>,
    body: Result<Json<PredictRequest>, JsonRejection>,
) -> Response {
    let work = async {
        let Json(req) = body.map_err(rejection)?;
        check_right(&req.truncation_direction)?;
        let (seqs, batched) = match req.inputs {
            PredictInput::One(t) => (vec![Sequence::Text(t)], false),
            PredictInput::Pair([a, b]) => (vec![Sequence::Pair(a, b)], false),
            PredictInput::Many(items) => (
                items
                    .into_iter()
                    .map(|i| match i {
                        PredictItem::Text(t) | PredictItem::Single([t]) => Sequence::Text(t),
                        PredictItem::Pair([a, b]) => Sequence::Pair(a, b),
                    })
                    .collect(),
                true,
            ),
        };
        state.check_batch(seqs.len())?;
        let ad = state.admit()?;
        let Task::Classifier { labels } = &ad.engine.task else {
            return Err(ApiError::validation(
                "this model embeds and has no classification head: use /embed",
            ));
        };
        let tokens = ad.engine.tokenize(seqs, req.truncate).await?;
        let rows = ad.engine.infer(tokens, &state.metrics).await?;
        let out: Vec<Vec<Prediction>> = rows
            .iter()
            .map(|row| predictions(row, labels, req.raw_scores))
            .collect();
        Ok(if batched {
            Json(json!(out))
        } else {
            Json(json!(out.into_iter().next().unwrap_or_default()))
        })
    };
    state.observed("/predict", work).await
}

/// Labels with their softmax probabilities (or raw logits), best first.
fn predictions(logits: &[f32], labels: &[String], raw: bool) -> Vec<Prediction> {
    let scores: Vec<f32> = if raw {
        logits.to_vec()
    } else {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        exps.iter().map(|e| e / sum).collect()
    };
    let mut out: Vec<Prediction> = scores
        .into_iter()
        .enumerate()
        .map(|(i, score)| Prediction {
            score,
            label: labels
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("LABEL_{i}")),
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Json<TokenizeRequest>, JsonRejection>,
) -> Response {
    let work = async {
        let Json(req) = body.map_err(rejection)?;
        let texts = req.inputs.into_vec();
        state.check_batch(texts.len())?;
        let ad = state.admit()?;
        let pieces = ad.engine.pieces(texts, req.add_special_tokens).await?;
        let out: Vec<Vec<Piece>> = pieces
            .into_iter()
            .map(|p| {
                p.into_iter()
                    .map(|t| Piece {
                        id: t.id,
                        text: t.token,
                        special: t.special,
                        start: (!t.special).then_some(t.start),
                        stop: (!t.special).then_some(t.stop),
                    })
                    .collect()
            })
            .collect();
        Ok(Json(out))
    };
    state.observed("/tokenize", work).await
}

async fn info(State(state): State<Arc<AppState>>) -> Response {
    let Some(engine) = state.engine.get() else {
        return ApiError::unavailable("the model is loading").into_response();
    };
    let model_type = match &engine.task {
        Task::Embedding { pooling, dim } => json!({"embedding": {
            "pooling": match pooling {
                crate::commands::embed::Pooling::Mean => "mean",
                crate::commands::embed::Pooling::Cls => "cls",
            },
            "dimension": dim,
        }}),
        Task::Classifier { labels } => json!({"classifier": {
            "id2label": labels.iter().enumerate().map(|(i, l)| (i.to_string(), json!(l))).collect::<serde_json::Map<_, _>>(),
        }}),
    };
    Json(json!({
        "model_id": state.model_id,
        "model_dtype": engine.dtype,
        "model_type": model_type,
        "max_concurrent_requests": state.max_concurrent_requests,
        "max_input_length": engine.max_input_length,
        "max_batch_tokens": engine.max_batch_tokens,
        "max_client_batch_size": state.max_client_batch_size,
        "tokenization_workers": engine.tokenization_workers,
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.engine.get() {
        None => ApiError::unavailable("the model is loading").into_response(),
        Some(e) if !e.healthy() => ApiError::unavailable("the batcher stopped").into_response(),
        Some(_) if state.stopping.load(Ordering::Relaxed) => {
            ApiError::unavailable("the server is shutting down").into_response()
        }
        Some(_) => Json(json!({"status": "ok"})).into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_are_probabilities_best_first() {
        let labels = vec!["neg".to_string(), "pos".to_string()];
        let p = predictions(&[0.0, 2.0], &labels, false);
        assert_eq!(p[0].label, "pos");
        assert!((p[0].score + p[1].score - 1.0).abs() < 1e-6);
        assert!((p[0].score - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
        let raw = predictions(&[0.5, -1.0], &labels, true);
        assert_eq!((raw[0].label.as_str(), raw[0].score), ("neg", 0.5));
    }

    /// Until the model has loaded, and once shutdown began, model routes answer 503.
    #[test]
    fn loading_and_stopping_servers_answer_503() {
        let state = AppState {
            engine: OnceLock::new(),
            metrics: Arc::new(Metrics::new()),
            permits: Semaphore::new(1),
            max_concurrent_requests: 1,
            max_client_batch_size: 2,
            model_id: "m".into(),
            stopping: AtomicBool::new(false),
        };
        let status = |r: Result<Admitted<'_>, ApiError>| r.err().map(|e| e.status());
        assert_eq!(status(state.admit()), Some(StatusCode::SERVICE_UNAVAILABLE));
        state.stopping.store(true, Ordering::Relaxed);
        assert_eq!(status(state.admit()), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(
            state.check_batch(3).unwrap_err().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            state.check_batch(0).unwrap_err().status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert!(state.check_batch(2).is_ok());
    }

    #[test]
    fn errors_carry_their_status() {
        assert_eq!(
            ApiError::too_large("x").status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            ApiError::overloaded("x").status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            ApiError::validation("x").status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
    }
}
