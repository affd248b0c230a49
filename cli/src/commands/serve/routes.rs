//! The HTTP routes: the OpenAI endpoints, the model list, health and metrics; the API key check;
//! JSON errors for unknown routes (404), wrong methods (405) and bodies over the limit (413).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tandem_engine::runtime::images::{HeldPlaces, ImageInput, Images, ImagesError};
use tandem_engine::runtime::sequence::ImageRows;
use tandem_engine::serve::{Event, EventSink, Handle, Request};
use tandem_engine::tokenizer::chat::ChatTemplate;
use tandem_engine::Tokenizer;
use tokio::sync::mpsc;

use super::api::{self, Header, Kind, Logprobs, Prompt};
use super::error::ApiError;

/// The most tokens a chat request without `max_tokens` generates on a model whose replies
/// wander (a base checkpoint, a model without a chat template), instead of the room left in
/// the context: such a model rarely says its turn is over, and the README's streamed example
/// once ran 4,083 tokens for two minutes on the default model.
pub const BASE_CHAT_MAX_TOKENS: u64 = 128;
/// What every handler sees.
pub struct AppState {
    pub handle: Handle,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template (`None` without a tokenizer vocabulary).
    pub chat: Option<ChatTemplate>,
    /// What chat responses carry in their `warning` field: the model is a base checkpoint or
    /// has no chat template ([`tandem_engine::checkpoint::tuning`]).
    pub chat_warning: Option<String>,
    /// The model's name in `/v1/models` and in responses.
    pub model_id: String,
    /// The model's default sampling (`Loaded::sampling`): what a request's absent sampling
    /// fields take.
    pub sampling: tandem_engine::SamplerConfig,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// `--max-body-bytes` (at least 1).
    pub max_body_bytes: usize,
    /// When the server started (Unix seconds).
    pub created: u64,
    /// Responses so far, for ids.
    pub counter: AtomicU64,
    /// The vision tower, where the server takes images (`--mmproj`, `--max-images`): one image
    /// encoded at a time, off the async threads.
    pub images: Option<Arc<std::sync::Mutex<Images>>>,
    /// `<start_of_image>` as text, where the server takes images.
    pub image_marker: Option<String>,
    /// The model's vocabulary: image rows' ids start there.
    pub vocab: usize,
}

type Shared = Arc<AppState>;

/// The routes. `/health` is open; everything else needs the key when `--api-key` is set.
pub fn router(state: Shared) -> Router {
    let max_body_bytes = state.max_body_bytes;
    let api = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/health", get(health))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), count_responses))
        .with_state(state)
}

/// Counts every response by route and status.
async fn count_responses(State(st): State<Shared>, req: HttpRequest, next: Next) -> Response {
    let route = match req.uri().path() {
        p @ ("/v1/completions" | "/v1/chat/completions" | "/v1/models" | "/health" | "/metrics") => p,
        _ => "other",
    }
    .to_string();
    let r = next.run(req).await;
    st.handle.metrics().http_response(&route, r.status().as_u16());
    r
}

/// The credentials of `Authorization: Bearer KEY`: the scheme in any case (RFC 9110 section
/// 11.1), then one or more spaces; `None` for another scheme.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// `Authorization: Bearer KEY`, compared in constant time.
async fn authorize(State(st): State<Shared>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .unwrap_or("");
        let ok: bool = given.as_bytes().ct_eq(key.as_bytes()).into();
        if !ok {
            let mut e = ApiError::status(
                StatusCode::UNAUTHORIZED,
                "a valid API key is required: Authorization: Bearer KEY",
            );
            e.kind = "invalid_request_error";
            e.code = Some("invalid_api_key");
            return e.into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: HttpRequest) -> ApiError {
    let mut e = ApiError::status(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    );
    e.code = Some("unknown_url");
    e
}

async fn method_not_allowed(req: HttpRequest) -> ApiError {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// 200 while the model can run (`"status": "degraded"` once a unit was lost and the model
/// runs on the rest: `units` and `lost` name them), 503 once it cannot (`error` says why).
async fn health(State(st): State<Shared>) -> Response {
    let m = st.handle.metrics();
    let h = st.handle.health();
    let (status, code) = match (&h.unavailable, h.degraded()) {
        (Some(_), _) => ("unavailable", StatusCode::SERVICE_UNAVAILABLE),
        (None, true) => ("degraded", StatusCode::OK),
        (None, false) => ("ok", StatusCode::OK),
    };
    let mut body = json!({"status": status, "running": m.running(), "queued": m.queue_depth()});
    if h.degraded() {
        body["units"] = json!(h.units);
        body["lost"] = json!(h.lost);
    }
    if let Some(why) = &h.unavailable {
        body["error"] = json!(why);
    }
    (code, Json(body)).into_response()
}

async fn metrics(State(st): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        st.handle.metrics().render(),
    )
        .into_response()
}

async fn models(State(st): State<Shared>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id, "object": "model", "created": st.created, "owned_by": "tandem",
            "context_length": st.handle.context(),
        }],
    }))
}

/// The body, or the rejection as an OpenAI error (413 over the size limit, which it names).
fn body(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "the request body is larger than --max-body-bytes ({} bytes)",
                st.max_body_bytes
            )
        } else {
            r.body_text()
        };
        ApiError::status(status, message)
    })
}

async fn completions(
    State(st): State<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let obj = api::object(&body(&st, raw)?)?;
    let prompt = api::prompt(&obj)?;
    let common = api::common(&obj, false, &st.sampling)?;
    let ids = match prompt {
        Prompt::Ids(ids) => ids,
        Prompt::Text(text) => {
            need_vocabulary(&st, "a text prompt")?;
            st.tokenizer
                .encode(&text, true)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?
        }
    };
    // OpenAI's completions default to 16 tokens.
    let max_tokens = common.max_tokens.unwrap_or(16);
    let prompt = Prompted {
        ids,
        images: Vec::new(),
        held: None,
    };
    generate(&st, Kind::Completion, prompt, max_tokens, common, arrived).await
}

async fn chat_completions(
    State(st): State<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let obj = api::object(&body(&st, raw)?)?;
    let (messages, images) = api::messages(&obj, st.image_marker.as_deref())?;
    let common = api::common(&obj, true, &st.sampling)?;
    need_vocabulary(&st, "chat")?;
    let template = st
        .chat
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no chat template", Some("messages")))?;
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    let (ids, rows, held) = if images.is_empty() {
        let ids = st
            .tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
        (ids, Vec::new(), None)
    } else {
        with_images(&st, text, images).await?
    };
    // Chat defaults to the room left in the context; on a model whose replies wander (a base
    // checkpoint, no template: the `warning` says so) to at most BASE_CHAT_MAX_TOKENS.
    let room = st.handle.context().saturating_sub(ids.len()) as u64;
    let default = if st.chat_warning.is_some() {
        room.min(BASE_CHAT_MAX_TOKENS)
    } else {
        room
    };
    let max_tokens = common.max_tokens.unwrap_or(default.max(1));
    let prompt = Prompted {
        ids,
        images: rows,
        held,
    };
    generate(&st, Kind::Chat, prompt, max_tokens, common, arrived).await
}

/// A prompt's ids, with its images' soft tokens for the image table and the places they hold
/// (given back when the request ends: its sink is dropped).
struct Prompted {
    ids: Vec<u32>,
    images: Vec<ImageRows>,
    held: Option<HeldPlaces>,
}

/// Encodes a chat's images with the vision tower (one request at a time, on a blocking thread),
/// takes places of the image table for them and tokenizes the text with them.
async fn with_images(
    st: &AppState,
    text: String,
    images: Vec<ImageInput>,
) -> Result<(Vec<u32>, Vec<ImageRows>, Option<HeldPlaces>), ApiError> {
    let tower = st
        .images
        .clone()
        .ok_or_else(|| ApiError::invalid("this server takes no images", Some("messages")))?;
    let (tokenizer, vocab) = (st.tokenizer.clone(), st.vocab);
    let done = tokio::task::spawn_blocking(move || {
        let mut tower = tower.lock().unwrap_or_else(|p| p.into_inner());
        let features = tower.encode(&images, 1)?;
        let places = tower.pool().take(images.len())?;
        let held = tower.pool().hold(places);
        let ids = tower.tokenize(&tokenizer, &text, held.places(), false, vocab)?;
        let per_image = tower.tokens_per_image();
        let rows = features
            .into_iter()
            .zip(held.places())
            .map(|(values, &p)| ImageRows {
                first: p * per_image,
                values,
            })
            .collect();
        Ok::<_, ImagesError>((ids, rows, Some(held)))
    })
    .await
    .map_err(|e| {
        ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the images: {e}"),
        )
    })?;
    done.map_err(|e| match e {
        ImagesError::TooMany { .. } => ApiError::status(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        ImagesError::Model(_) | ImagesError::Session(_) | ImagesError::Unit(_) => {
            ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
        _ => ApiError::invalid(e.to_string(), Some("messages")),
    })
}

fn need_vocabulary(st: &AppState, what: &str) -> Result<(), ApiError> {
    if st.tokenizer.has_vocabulary() {
        return Ok(());
    }
    Err(ApiError::invalid(
        format!("{what} needs a tokenizer, and this model has none (no tokenizer.json): send token ids to /v1/completions"),
        Some(if what == "chat" { "messages" } else { "prompt" }),
    ))
}

/// A request's events, through a channel the scheduler never waits on, with log-probabilities
/// where the request asked for them.
struct ChannelSink {
    tx: mpsc::UnboundedSender<Event>,
    logprobs: Option<usize>,
    /// The image table places the request's images hold, given back when it ends.
    _held: Option<HeldPlaces>,
}

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.tx.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    fn logprobs(&self) -> Option<usize> {
        self.logprobs
    }
}

async fn generate(
    st: &AppState,
    kind: Kind,
    prompt: Prompted,
    max_tokens: u64,
    common: api::Common,
    arrived: Instant,
) -> Result<Response, ApiError> {
    // Checked, with the prompt and the sampling, once: by `Handle::submit`.
    let max_tokens = usize::try_from(max_tokens).unwrap_or(usize::MAX);
    let (tx, rx) = mpsc::unbounded_channel();
    st.handle.submit(Request {
        prompt: prompt.ids,
        max_tokens,
        sampling: common.sampling,
        stop: common.stop,
        sink: Box::new(ChannelSink {
            tx,
            logprobs: common.logprobs,
            _held: prompt.held,
        }),
        arrived,
        images: prompt.images,
    })?;
    let n = st.counter.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let header = Header {
        kind,
        id: format!("{prefix}-{:x}-{n}", st.created),
        created: unix_now(),
        model: st.model_id.clone(),
        warning: match kind {
            Kind::Chat => st.chat_warning.clone(),
            Kind::Completion => None,
        },
    };
    let logprobs = common
        .logprobs
        .map(|_| (Logprobs::new(kind), st.tokenizer.clone()));
    if common.stream {
        Ok(stream(header, rx, common.include_usage, st.handle.clone(), logprobs).into_response())
    } else {
        Ok(collect(header, rx, &st.handle, logprobs).await)
    }
}

/// A request the model failed: 500 with the error (which names the unit and what failed), or
/// 503 where the model can no longer run anywhere (a unit was lost and the rest cannot hold it).
fn failed(handle: &Handle, message: String) -> ApiError {
    if handle.health().unavailable.is_none() {
        return ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, message);
    }
    let mut e = ApiError::status(StatusCode::SERVICE_UNAVAILABLE, message);
    e.code = Some("model_unavailable");
    e
}

/// The log-probabilities a request asked for, gathered as its tokens come, and the tokenizer
/// that names their tokens.
type Gathered = Option<(Logprobs, Arc<Tokenizer>)>;

/// Adds a token's log-probabilities to `gathered`.
fn gather(gathered: &mut Gathered, id: u32, lp: Option<&tandem_engine::runtime::sampler::TokenLogprobs>) {
    if let (Some((l, tokenizer)), Some(lp)) = (gathered.as_mut(), lp) {
        l.push(tokenizer, id, lp);
    }
}

/// The `logprobs` object of the tokens gathered since the last time (`null` where none was
/// asked for), text offsets limited to `len` characters.
fn taken(gathered: &mut Gathered, len: Option<usize>) -> Value {
    gathered.as_mut().map_or(Value::Null, |(l, _)| l.take(len))
}

/// A non-streamed answer: the events collected into one document.
async fn collect(
    header: Header,
    mut rx: mpsc::UnboundedReceiver<Event>,
    handle: &Handle,
    mut logprobs: Gathered,
) -> Response {
    let (mut text, mut ids) = (String::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token {
                id,
                text: t,
                logprobs: lp,
            } => {
                ids.push(id);
                text.push_str(&t);
                gather(&mut logprobs, id, lp.as_ref());
            }
            Event::Done {
                text: t,
                finish_reason,
                prompt_tokens,
                completion_tokens,
            } => {
                text.push_str(&t);
                let usage = api::usage(prompt_tokens, completion_tokens);
                let lp = taken(&mut logprobs, Some(text.chars().count()));
                let doc = header.response(&text, &ids, finish_reason, usage, lp);
                return (StatusCode::OK, Json(doc)).into_response();
            }
            Event::Failed { message } => return failed(handle, message).into_response(),
        }
    }
    ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "the scheduler stopped").into_response()
}

/// A streamed answer: one SSE `data:` chunk per token (with its log-probabilities where asked
/// for), the finish, the usage if asked, `[DONE]`.
fn stream(
    header: Header,
    rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
    handle: Handle,
    logprobs: Gathered,
) -> impl IntoResponse {
    struct St {
        handle: Handle,
        header: Header,
        rx: mpsc::UnboundedReceiver<Event>,
        out: VecDeque<SseEvent>,
        first: bool,
        done: bool,
        include_usage: bool,
        logprobs: Gathered,
    }
    let data = |v: Value| SseEvent::default().data(v.to_string());
    let st = St {
        handle,
        header,
        rx,
        out: VecDeque::new(),
        first: true,
        done: false,
        include_usage,
        logprobs,
    };
    let events = futures_util::stream::unfold(st, move |mut st| async move {
        loop {
            if let Some(e) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(e), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Token { id, text, logprobs }) => {
                    gather(&mut st.logprobs, id, logprobs.as_ref());
                    let lp = taken(&mut st.logprobs, None);
                    let c = st.header.chunk(&text, &[id], st.first, None, lp);
                    st.first = false;
                    st.out.push_back(data(c));
                }
                Some(Event::Done {
                    text,
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let c = st
                        .header
                        .chunk(&text, &[], st.first, Some(finish_reason), Value::Null);
                    st.out.push_back(data(c));
                    if st.include_usage {
                        let u = api::usage(prompt_tokens, completion_tokens);
                        st.out.push_back(data(st.header.usage_chunk(u)));
                    }
                    st.out.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
                Some(Event::Failed { message }) => {
                    let e = failed(&st.handle, message);
                    st.out.push_back(data(e.body()));
                    st.out.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
                None => st.done = true,
            }
        }
    });
    Sse::new(events)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
