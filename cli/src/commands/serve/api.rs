//! OpenAI's request fields, read one by one from the JSON body (unknown fields are ignored, a
//! field of the wrong type is a 400 naming it, and so is one that asks for what tandem does not
//! do: [`unsupported`]), and the response and chunk documents, with their log-probabilities
//! ([`Logprobs`]).

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tandem_engine::runtime::images::ImageInput;
use tandem_engine::runtime::sampler::{TokenLogprobs, MAX_TOP_LOGPROBS};
use tandem_engine::serve::FinishReason;
use tandem_engine::tokenizer::chat::{Message, Role};
use tandem_engine::{SamplerConfig, Tokenizer};

use super::error::ApiError;

/// The most stop strings a request may give.
const MAX_STOPS: usize = 16;

/// A JSON body as an object, or a 400.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object", None)),
        Err(e) => Err(ApiError::invalid(
            format!("the request body is not valid JSON: {e}"),
            None,
        )),
    }
}

/// Field `name` of `obj` as `T`; absent or null is `None`. A value of the wrong type is a 400
/// in the API's words: `` `max_tokens` must be an integer >= 0, got the string "ten" ``.
pub fn field<T: DeserializeOwned>(
    obj: &Map<String, Value>,
    name: &str,
    expected: &str,
) -> Result<Option<T>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v).map(Some).map_err(|_| {
            ApiError::invalid(
                format!("`{name}` must be {expected}, got {}", describe(v)),
                Some(name),
            )
        }),
    }
}

/// A JSON value as an error message shows it: its type, and the value where it is short.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() <= 32 => format!("the string {v}"),
        Value::String(_) => "a string".into(),
        Value::Array(a) => format!("a list of {} items", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// `stop`: a string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `prompt` of `/v1/completions`: text, or token ids (each alone or as a list of one).
#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// A completion prompt.
pub enum Prompt {
    /// Text, to encode with BOS as the model's files ask.
    Text(String),
    /// Token ids, fed as they are.
    Ids(Vec<u32>),
}

/// What every generation request shares.
pub struct Common {
    pub max_tokens: Option<u64>,
    pub sampling: SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Log-probabilities with each token, and how many alternatives ([`logprobs`]).
    pub logprobs: Option<usize>,
}

/// A seed for a request without one: different for every request, as OpenAI's are.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Reads the fields every generation request shares. `max_tokens_field` is `max_tokens`, or
/// for chat also `max_completion_tokens` (which wins). A sampling field the request leaves out
/// (or sends as `null`) takes `defaults`, the model's default sampling (its
/// `generation_config.json`, else tandem's: what `engine run` uses without flags), so that the
/// same seed gives `run` and `serve` the same text. That includes `temperature`, which
/// OpenAI's API defaults to 1: the model's default is 1 too unless its generation config says
/// otherwise. The seed is never the model's: a request without one gets a fresh one.
pub fn common(obj: &Map<String, Value>, chat: bool, defaults: &SamplerConfig) -> Result<Common, ApiError> {
    unsupported(obj)?;
    let n: Option<u64> = field(obj, "n", "1")?;
    if n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is supported", Some("n")));
    }
    let mut max_tokens: Option<u64> = field(obj, "max_tokens", "an integer >= 1")?;
    if chat {
        if let Some(m) = field::<u64>(obj, "max_completion_tokens", "an integer >= 1")? {
            max_tokens = Some(m);
        }
    }
    let top_k: Option<i64> = field(obj, "top_k", "an integer (0: off)")?;
    let seed: Option<i64> = field(obj, "seed", "an integer")?;
    let sampling = SamplerConfig {
        temperature: field(obj, "temperature", "a number >= 0")?.unwrap_or(defaults.temperature),
        top_k: top_k.map_or(defaults.top_k, |k| {
            usize::try_from(k.max(0)).unwrap_or(usize::MAX)
        }),
        top_p: field(obj, "top_p", "a number in (0, 1]")?.unwrap_or(defaults.top_p),
        min_p: field(obj, "min_p", "a number in [0, 1)")?.unwrap_or(defaults.min_p),
        repetition_penalty: field(obj, "repetition_penalty", "a number > 0")?
            .unwrap_or(defaults.repetition_penalty),
        // A negative seed keeps its bits.
        seed: seed.map_or_else(fresh_seed, |s| s as u64),
    };
    let stop = match field::<Stop>(obj, "stop", "a string or a list of strings")? {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            format!("at most {MAX_STOPS} stop strings, got {}", stop.len()),
            Some("stop"),
        ));
    }
    let stream = field(obj, "stream", "true or false")?.unwrap_or(false);
    #[derive(Deserialize)]
    struct StreamOptions {
        include_usage: Option<bool>,
    }
    let include_usage = field::<StreamOptions>(
        obj,
        "stream_options",
        "an object such as {\"include_usage\": true}",
    )?
    .and_then(|o| o.include_usage)
    .unwrap_or(false);
    Ok(Common {
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        logprobs: logprobs(obj, chat)?,
    })
}

/// Whether each token should come with its log-probability, and with how many of the most
/// likely tokens (`None`: no log-probabilities). Chat: `logprobs` true, with `top_logprobs`
/// alternatives (0 to 20; 0 when absent; a positive `top_logprobs` without `logprobs` is a
/// 400). Completions: `logprobs` N (0 to 20; OpenAI's legacy API allows 5), each position then
/// carrying the N most likely tokens and the chosen one; `false` and `null` ask for none.
fn logprobs(obj: &Map<String, Value>, chat: bool) -> Result<Option<usize>, ApiError> {
    let range = format!("an integer from 0 to {MAX_TOP_LOGPROBS}");
    let count = |name: &str| -> Result<Option<usize>, ApiError> {
        let out_of_range = |v: &Value| {
            ApiError::invalid(
                format!("`{name}` must be {range}, got {}", describe(v)),
                Some(name),
            )
        };
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_TOP_LOGPROBS as u64 => Ok(Some(n as usize)),
                _ => Err(out_of_range(v)),
            },
        }
    };
    if !chat {
        if obj.get("logprobs") == Some(&Value::Bool(false)) {
            return Ok(None);
        }
        return count("logprobs");
    }
    let on: bool = field(obj, "logprobs", "true or false")?.unwrap_or(false);
    let top = count("top_logprobs")?;
    if !on {
        if top.is_some_and(|n| n > 0) {
            return Err(ApiError::invalid(
                "`top_logprobs` needs `logprobs`: true",
                Some("top_logprobs"),
            ));
        }
        return Ok(None);
    }
    Ok(Some(top.unwrap_or(0)))
}

/// A log-probability as JSON holds it: `-inf` (a token of probability 0) as -9999, as
/// OpenAI's API writes it.
fn finite(logprob: f64) -> f64 {
    if logprob.is_finite() {
        logprob
    } else {
        -9999.0
    }
}

/// Token `id` as log-probabilities name it: its text and its bytes (a byte-fallback token's
/// one byte; a special token's spelling). A token whose bytes are not UTF-8 on their own (part
/// of a character) is written `bytes:\xe2` as OpenAI's API does; an id the tokenizer does not
/// know (or a model without one) is the empty string.
fn spelled(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id).unwrap_or_default();
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => t.to_owned(),
        Err(_) => {
            let hex: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("bytes:{hex}")
        }
    };
    (text, bytes)
}

/// A choice's log-probabilities as they come, token by token: all of them for a whole answer,
/// or those since the last chunk for a stream ([`Logprobs::take`]).
pub struct Logprobs {
    kind: Kind,
    chat: ChatLogprobs,
    completion: CompletionLogprobs,
    offsets: Offsets,
}

impl Logprobs {
    /// None yet, for a response of `kind`.
    pub fn new(kind: Kind) -> Self {
        Logprobs {
            kind,
            chat: ChatLogprobs::default(),
            completion: CompletionLogprobs::default(),
            offsets: Offsets::default(),
        }
    }

    /// Adds generated token `id` and its `lp`.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32, lp: &TokenLogprobs) {
        match self.kind {
            Kind::Chat => self.chat.push(tokenizer, id, lp),
            Kind::Completion => {
                let offset = self.offsets.next(tokenizer, id);
                self.completion.push(tokenizer, id, lp, offset);
            }
        }
    }

    /// The `logprobs` object of the tokens added since the last `take`, the text offsets
    /// limited to `len` characters (where a stop string cut the text).
    pub fn take(&mut self, len: Option<usize>) -> Value {
        match self.kind {
            Kind::Chat => std::mem::take(&mut self.chat).to_json(),
            Kind::Completion => {
                let mut c = std::mem::take(&mut self.completion);
                if let Some(len) = len {
                    c.clip_offsets(len);
                }
                c.to_json()
            }
        }
    }
}

/// Where each token's text starts in the generated text, in characters (`text_offset`): the
/// text of the tokens before it, special tokens skipped, counted as it becomes whole (a
/// character split over byte tokens starts where its first byte's token does).
#[derive(Default)]
struct Offsets {
    /// Ids whose text is not yet whole characters.
    pending: Vec<u32>,
    chars: usize,
}

impl Offsets {
    /// The offset of token `id`, the next generated.
    fn next(&mut self, tokenizer: &Tokenizer, id: u32) -> usize {
        let at = self.chars;
        self.pending.push(id);
        let text = tokenizer.decode(&self.pending, true).unwrap_or_default();
        // (A character has at most 4 bytes: a text still unfinished after 4 ids is its own.)
        if !text.ends_with('\u{FFFD}') || self.pending.len() >= 4 {
            self.chars += text.chars().count();
            self.pending.clear();
        }
        at
    }
}

/// Chat's `logprobs`: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
/// "logprob", "bytes"}, ...]}, ...]}`.
#[derive(Default)]
struct ChatLogprobs {
    content: Vec<Value>,
}

impl ChatLogprobs {
    /// Adds token `id`, generated with `lp`.
    fn push(&mut self, tokenizer: &Tokenizer, id: u32, lp: &TokenLogprobs) {
        let entry = |id: u32, logprob: f64| {
            let (token, bytes) = spelled(tokenizer, id);
            json!({"token": token, "logprob": finite(logprob), "bytes": bytes})
        };
        let mut e = entry(id, lp.logprob);
        e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
        self.content.push(e);
    }

    /// The `logprobs` object.
    fn to_json(&self) -> Value {
        json!({"content": self.content})
    }
}

/// Completions' `logprobs`: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one
/// entry per token; each `top_logprobs` entry maps the most likely tokens' texts, and the
/// chosen token's, to their log-probabilities (a text two tokens share keeps the likelier).
#[derive(Default)]
struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f64>,
    top_logprobs: Vec<Map<String, Value>>,
    text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Adds token `id`, generated with `lp`, whose text starts at `offset`.
    fn push(&mut self, tokenizer: &Tokenizer, id: u32, lp: &TokenLogprobs, offset: usize) {
        let mut top = Map::new();
        let chosen = (id, lp.logprob);
        // The chosen one goes in where it ranks (it may be among the best).
        let mut ranked: Vec<(u32, f64)> = lp.top.clone();
        if !ranked.iter().any(|&(t, _)| t == id) {
            ranked.push(chosen);
        }
        for (t, l) in ranked {
            top.entry(spelled(tokenizer, t).0)
                .or_insert_with(|| Value::from(finite(l)));
        }
        self.tokens.push(spelled(tokenizer, id).0);
        self.token_logprobs.push(finite(lp.logprob));
        self.top_logprobs.push(top);
        self.text_offset.push(offset);
    }

    /// Limits every offset to `len` characters (the text a stop string cut).
    fn clip_offsets(&mut self, len: usize) {
        for o in &mut self.text_offset {
            *o = (*o).min(len);
        }
    }

    /// The `logprobs` object.
    fn to_json(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

/// A 400 for a field that asks for what tandem does not do, rather than an answer that
/// silently lacks it: `response_format` other than `{"type": "text"}`, `tools` other than an
/// empty list. Absent, null and those values ask for nothing and pass.
fn unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let refuse = |name: &str, what: &str| {
        Err(ApiError::invalid(
            format!("`{name}` is not supported: {what}"),
            Some(name),
        ))
    };
    match obj.get("response_format") {
        None | Some(Value::Null) => {}
        Some(Value::Object(f)) if f.get("type") == Some(&Value::from("text")) => {}
        Some(Value::Object(f)) => {
            let kind = f.get("type").map_or_else(|| "no type".into(), describe);
            return refuse(
                "response_format",
                &format!("only {{\"type\": \"text\"}} is (got {kind}): no JSON mode or schema"),
            );
        }
        Some(v) => {
            return refuse(
                "response_format",
                &format!("only {{\"type\": \"text\"}} is, got {}", describe(v)),
            )
        }
    }
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(v) => {
            return refuse(
                "tools",
                &format!("no tool or function calls (got {})", describe(v)),
            )
        }
    }
    Ok(())
}

/// `prompt` of `/v1/completions`.
pub fn prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let one = |n: usize| -> Result<(), ApiError> {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid(
                format!("one prompt per request is supported, got {n}"),
                Some("prompt"),
            ))
        }
    };
    match field::<PromptField>(obj, "prompt", "a string or a list of token ids") {
        Ok(Some(PromptField::Text(t))) => Ok(Prompt::Text(t)),
        Ok(Some(PromptField::Ids(ids))) => Ok(Prompt::Ids(ids)),
        Ok(Some(PromptField::Texts(mut v))) => {
            one(v.len())?;
            Ok(Prompt::Text(v.remove(0)))
        }
        Ok(Some(PromptField::IdLists(mut v))) => {
            one(v.len())?;
            Ok(Prompt::Ids(v.remove(0)))
        }
        Ok(None) => Err(ApiError::invalid("missing field `prompt`", Some("prompt"))),
        Err(_) => Err(ApiError::invalid(
            "`prompt` must be a string or a list of token ids",
            Some("prompt"),
        )),
    }
}

/// `messages` of `/v1/chat/completions`, with the images of their `image_url` parts (data
/// URLs) in order. Each image part becomes `marker` (the model's `<start_of_image>`) in its
/// message's text, where text parts are trimmed as Gemma 3's template trims them; without a
/// marker (a server without image input) an image part is refused.
pub fn messages(
    obj: &Map<String, Value>,
    marker: Option<&str>,
) -> Result<(Vec<Message>, Vec<ImageInput>), ApiError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Url {
        Object { url: String },
        Text(String),
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        text: Option<String>,
        image_url: Option<Url>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
    }
    #[derive(Deserialize)]
    struct Raw {
        role: String,
        content: Option<Content>,
    }
    let raw: Vec<Raw> = field(obj, "messages", "a list of {\"role\", \"content\"} objects")?
        .ok_or_else(|| ApiError::invalid("missing field `messages`", Some("messages")))?;
    if raw.is_empty() {
        return Err(ApiError::invalid("`messages` is empty", Some("messages")));
    }
    let mut images = Vec::new();
    let messages = raw
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}]: role {other:?} is not supported (system, developer, user, assistant)"),
                        Some("messages"),
                    ))
                }
            };
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.into_iter().enumerate() {
                        match (p.kind.as_str(), p.text, p.image_url) {
                            ("text", Some(t), _) => text.push_str(t.trim()),
                            ("image_url", _, Some(url)) => {
                                let at = format!("messages[{i}].content[{j}].image_url");
                                let Some(marker) = marker else {
                                    return Err(ApiError::invalid(
                                        format!("{at}: this server takes no images (start it with --mmproj FILE, or --max-images N for a Hugging Face multimodal directory)"),
                                        Some("messages"),
                                    ));
                                };
                                let url = match url {
                                    Url::Object { url } | Url::Text(url) => url,
                                };
                                let bytes = data_url(&url).map_err(|why| ApiError::invalid(format!("{at}: {why}"), Some("messages")))?;
                                images.push(ImageInput {
                                    name: at,
                                    bytes,
                                });
                                text.push_str(marker);
                            }
                            (kind, _, _) => {
                                return Err(ApiError::invalid(
                                    format!("messages[{i}].content[{j}]: a part of type {kind:?} is not supported (text, image_url)"),
                                    Some("messages"),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            Ok(Message::new(role, content))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((messages, images))
}

/// The bytes of a `data:` URL with base64 content; remote URLs are refused (the server fetches
/// nothing).
fn data_url(url: &str) -> Result<Vec<u8>, String> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split(':').next().unwrap_or("");
        return Err(format!(
            "{scheme:?} URLs are not fetched: send the image inline as a data URL (data:image/png;base64,...)"
        ));
    };
    let (head, payload) = rest
        .split_once(',')
        .ok_or("a data URL needs a comma before its data")?;
    if !head.ends_with(";base64") {
        return Err("only base64 data URLs are taken (data:image/png;base64,...)".into());
    }
    base64::decode(payload.trim()).map_err(|e| format!("the data URL is not valid base64: {e}"))
}

/// The two response kinds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// What identifies a response and its chunks.
pub struct Header {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// tandem's `warning` field (OpenAI's clients ignore fields they do not know): set on
    /// chat responses when the model is a base checkpoint or has no chat template; in a
    /// stream, the first chunk carries it.
    pub warning: Option<String>,
}

/// The usage object.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

impl Header {
    /// The whole (non-streamed) response. `token_ids` is tandem's addition (the generated
    /// ids, which the text may not show: special tokens, or a model without a tokenizer);
    /// `logprobs` the choice's (`null` where not asked for).
    pub fn response(
        &self,
        text: &str,
        token_ids: &[u32],
        finish: FinishReason,
        usage: Value,
        logprobs: Value,
    ) -> Value {
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": 0, "text": text, "logprobs": logprobs,
                "finish_reason": finish.as_str(), "token_ids": token_ids,
            }),
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish.as_str(),
                "token_ids": token_ids,
            }),
        };
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion",
        };
        let mut doc = json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice], "usage": usage,
        });
        self.warn(&mut doc);
        doc
    }

    /// Adds the `warning` field to `doc` when there is one.
    fn warn(&self, doc: &mut Value) {
        if let (Some(w), Some(obj)) = (&self.warning, doc.as_object_mut()) {
            obj.insert("warning".into(), Value::from(w.as_str()));
        }
    }

    /// One streamed chunk: `text` (and for chat the assistant role in the first), the ids it
    /// came with and their `logprobs` (`null` where not asked for), and the finish reason in
    /// the last.
    pub fn chunk(
        &self,
        text: &str,
        token_ids: &[u32],
        first: bool,
        finish: Option<FinishReason>,
        logprobs: Value,
    ) -> Value {
        let finish = finish.map(FinishReason::as_str);
        let (object, choice) = match self.kind {
            Kind::Completion => (
                "text_completion",
                json!({
                    "index": 0, "text": text, "logprobs": logprobs,
                    "finish_reason": finish, "token_ids": token_ids,
                }),
            ),
            Kind::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                (
                    "chat.completion.chunk",
                    json!({
                        "index": 0, "delta": delta, "logprobs": logprobs,
                        "finish_reason": finish, "token_ids": token_ids,
                    }),
                )
            }
        };
        let mut doc = json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [choice],
        });
        if first {
            self.warn(&mut doc);
        }
        doc
    }

    /// The last chunk of a stream with `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": usage,
        })
    }
}
