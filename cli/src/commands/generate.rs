//! What `run` and `chat` share: the engine's one generation loop
//! (`tandem_engine::runtime::sequence`) with its events written to standard output, and its
//! errors told in terms of this command's flags.

use std::io::Write;
use std::time::Instant;

use tandem_engine::{
    generate, Event, EventSink, FinishReason, GenerateError, GenerationStats, Loaded, Request, RequestError,
    SamplerConfig, SessionError,
};

/// What one generation asks for.
pub struct Ask<'a> {
    /// The prompt ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate (capped at the context: generation stops there anyway).
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplerConfig,
    /// Stop strings.
    pub stop: &'a [String],
    /// Continue the cached sequence of slot 0 instead of starting anew.
    pub keep: bool,
}

/// What came out.
pub struct Generated {
    /// The generated ids (a stop token included).
    pub ids: Vec<u32>,
    /// Their text, cut before a stop string.
    pub text: String,
    /// The timing.
    pub stats: GenerationStats,
}

/// The events of one generation: ids and text collected, text also written to `out` as it
/// becomes final.
struct Collect<'a> {
    ids: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    out: Option<&'a mut (dyn Write + Send)>,
    error: Option<std::io::Error>,
}

impl Collect<'_> {
    fn write(&mut self, text: &str) -> bool {
        self.text.push_str(text);
        let Some(out) = self.out.as_mut() else {
            return true;
        };
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                self.error.get_or_insert(e);
                false
            }
        }
    }
}

impl EventSink for &mut Collect<'_> {
    fn send(&mut self, event: Event) -> bool {
        match event {
            Event::Token { id, text } => {
                self.ids.push(id);
                self.write(&text)
            }
            Event::Done {
                text, finish_reason, ..
            } => {
                self.finish = Some(finish_reason);
                self.write(&text)
            }
            Event::Failed { .. } => true,
        }
    }

    fn is_closed(&self) -> bool {
        self.error.is_some()
    }
}

/// Runs `ask` in slot 0 of `loaded`, writing the text to `out` as it comes (then a newline)
/// when given.
pub fn run(
    loaded: &mut Loaded,
    ask: Ask<'_>,
    out: Option<&mut (dyn Write + Send)>,
) -> anyhow::Result<Generated> {
    let streaming = out.is_some();
    let mut collect = Collect {
        ids: Vec::new(),
        text: String::new(),
        finish: None,
        out,
        error: None,
    };
    let request = Request {
        prompt: ask.prompt,
        max_tokens: ask.max_tokens.min(loaded.session.context()),
        sampling: ask.sampling,
        stop: ask.stop.to_vec(),
        sink: Box::new(&mut collect),
        arrived: Instant::now(),
    };
    let stats = generate(&mut loaded.session, &loaded.tokenizer, request, 0, ask.keep).map_err(explain);
    if let Some(e) = collect.error.take() {
        return Err(e.into());
    }
    let stats = stats?;
    if streaming {
        collect.write("\n");
        if let Some(e) = collect.error.take() {
            return Err(e.into());
        }
    }
    Ok(Generated {
        ids: collect.ids,
        text: collect.text,
        stats,
    })
}

/// The engine's error, told with the flag that changes it.
fn explain(e: GenerateError) -> anyhow::Error {
    match &e {
        GenerateError::Request(RequestError::PromptTooLong { .. })
        | GenerateError::Session(SessionError::ContextFull { .. }) => {
            anyhow::anyhow!("{e} (--context sets the context)")
        }
        GenerateError::Request(RequestError::Sampling(s)) => {
            let flag = match s.setting() {
                "temperature" => "--temperature",
                "top_p" => "--top-p",
                "min_p" => "--min-p",
                "repetition_penalty" => "--repeat-penalty",
                other => other,
            };
            anyhow::anyhow!(s.with_name(flag))
        }
        GenerateError::Request(RequestError::MaxTokens { value, context }) => {
            anyhow::anyhow!("--max-tokens must be between 1 and the context ({context}), got {value}")
        }
        GenerateError::Request(RequestError::StopWithoutText) => {
            anyhow::anyhow!("--stop needs a tokenizer, and this model has none (no tokenizer.json)")
        }
        _ => anyhow::anyhow!(e),
    }
}
