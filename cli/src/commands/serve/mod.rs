//! `engine serve`: an OpenAI-compatible HTTP server over continuous batching.
//!
//! The HTTP stack is tokio with axum: axum is tokio's own web framework, built on hyper and the
//! tower middleware ecosystem, all maintained by the tokio project; it gives routing, body
//! limits, server-sent events and graceful shutdown without a framework of our own. The
//! batching itself is in the engine (`tandem_engine::serve`): one batcher thread owns the
//! session, and the HTTP handlers only submit requests and forward its events.
//!
//! - [`api`]: OpenAI's request fields and response documents.
//! - [`routes`]: the endpoints, the API key check, the error answers.
//! - [`error`]: errors in OpenAI's shape.

mod api;
mod error;
mod routes;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tandem_engine::serve::{self, BatcherOptions, Handle, StepBuckets};

use super::speculate::DraftArgs;
use tandem_engine::tokenizer::chat::ChatTemplate;

use super::load::{load, ModelArgs};
use crate::Context;

/// Flags of `engine serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address or host name to listen on (loopback by default; 0.0.0.0 opens it to the
    /// network; a name such as localhost listens on the first address it resolves to, IPv4
    /// first).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at once (KV cache slots).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    parallel: u32,
    /// Requests that may wait for a slot; beyond them the server answers 503 with Retry-After.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    queue: u32,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long)]
    api_key: Option<String>,
    /// Largest request body in bytes (413 beyond it).
    #[arg(long, default_value_t = 1 << 20, value_parser = parse_max_body_bytes)]
    max_body_bytes: usize,
    /// The model's name in /v1/models and in responses (default: the model file's name).
    #[arg(long, value_parser = parse_model_name)]
    model_name: Option<String>,
    /// Prefill every prompt whole: no request keeps the prefix it shares with what its slot
    /// last held.
    #[arg(long)]
    no_prefix_reuse: bool,
    /// Pad steps to a few row counts (auto, on, off): on a GPU the first step of each shape
    /// builds its programs, and unpadded a server meets hundreds of shapes while clients wait.
    /// auto pads where the logits are computed on a device, not on the CPU. Unless off, one
    /// KV cache slot more than --parallel is loaded for the padding rows.
    #[arg(long, default_value = "auto", value_parser = parse_step_buckets)]
    step_buckets: StepBuckets,
    /// Seconds to let running requests finish after Ctrl-C or SIGTERM before cancelling them.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Speculative decoding, for a request running alone with nothing queued (several
    /// requests batch instead): the flags of `run`.
    #[command(flatten)]
    draft: DraftArgs,
}

fn parse_step_buckets(s: &str) -> Result<StepBuckets, String> {
    s.parse().map_err(|e| format!("--step-buckets {e}"))
}

/// `--max-body-bytes`: at least 1 (0 would answer every request with a body 413).
fn parse_max_body_bytes(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1 (the largest request body in bytes)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `--model-name`: not empty (clients send it back as `model`).
fn parse_model_name(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty (leave it out for the model file's name)".into());
    }
    Ok(s.to_string())
}

/// A budget error says what else to lower: `--parallel` sizes the KV cache too.
fn slots_hint(e: anyhow::Error, parallel: u32) -> anyhow::Error {
    match e.downcast_ref::<tandem_engine::LoadError>() {
        Some(tandem_engine::LoadError::Budget(b)) if parallel > 1 => anyhow::anyhow!(
            "{b}, or lower --parallel ({parallel} now: every slot holds a KV cache of --context tokens)"
        ),
        _ => e,
    }
}

/// Runs the command until Ctrl-C or SIGTERM.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    // Resolved before the model loads, so that a wrong name is told at once.
    let addrs = listen_addrs(&args.host, args.port)?;
    args.draft.check()?;
    // A server meets every step size: the Vulkan backend creates every matmul kernel variant
    // of its largest step at once, on several threads (`[backend.vulkan] prepare`), unless the
    // config says otherwise.
    let mut settings = args.model.settings(&ctx.settings);
    if settings.backend_options("vulkan").get("prepare").is_none() {
        settings.set_backend_option("vulkan", "prepare", "true");
    }
    let ctx = &Context {
        settings,
        search: ctx.search.clone(),
    };
    let sink = usize::from(args.step_buckets != StepBuckets::Off);
    let mut loaded =
        load(ctx, &args.model, args.parallel as usize + sink).map_err(|e| slots_hint(e, args.parallel))?;
    // The vision tower stays with the handlers (it encodes off the batcher thread).
    let images = loaded.images.take();
    let image_marker = images.as_ref().map(|i| i.marker().to_string());
    let vocab = loaded.session.vocab();
    let model_id = args.model_name.clone().unwrap_or_else(|| model_name(&args.model));
    // Said once in the log, and in every chat response's `warning` field.
    let chat_warning = loaded.tuning.advice().map(|a| {
        format!(
            "{a}; a chat request without max_tokens stops after {} tokens",
            routes::BASE_CHAT_MAX_TOKENS
        )
    });
    if let Some(advice) = &chat_warning {
        eprintln!("note: {advice}");
    }
    // What a request's absent sampling fields take.
    let sampling = loaded.sampling;
    let tokenizer = Arc::new(loaded.tokenizer);
    let chat = if tokenizer.has_vocabulary() {
        Some(ChatTemplate::new(
            tokenizer.chat_template(),
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        )?)
    } else {
        None
    };
    let draft = match args.draft.build(ctx, &args.model)? {
        Some(built) => Some(args.draft.setup(built, loaded.session.vocab())?),
        None => None,
    };
    let replace = replace(ctx, &args.model, args.parallel as usize + sink);
    let (handle, batcher) = serve::start_with(
        loaded.session,
        tokenizer.clone(),
        BatcherOptions {
            queue: args.queue as usize,
            reuse_prefix: !args.no_prefix_reuse,
            step_buckets: args.step_buckets,
        },
        Some(replace),
        draft,
    )
    .context("starting the batcher thread")?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let state = Arc::new(routes::AppState {
        handle: handle.clone(),
        tokenizer,
        chat,
        chat_warning,
        model_id,
        sampling,
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body_bytes,
        created,
        counter: AtomicU64::new(0),
        images: images.map(|i| Arc::new(std::sync::Mutex::new(i))),
        image_marker,
        vocab,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let grace = Duration::from_secs(args.shutdown_timeout);
    let served: anyhow::Result<()> = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addrs[..])
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "listening on http://{addr} ({} slots, queue {}, context {})",
            handle.slots(),
            args.queue,
            handle.context()
        );
        let app = routes::router(state);
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown(handle.clone(), grace))
            .await
            .context("serving")?;
        Ok(())
    });
    handle.shut_down();
    drop(handle);
    if batcher.join().is_err() {
        anyhow::bail!("the batcher thread panicked");
    }
    served?;
    eprintln!("stopped");
    Ok(())
}

/// What the batcher does when a unit is lost while serving: loads the model again through the
/// one load path without the lost units (`load_without`), and says in one line on stderr which
/// unit was lost, what failed and where its parts went (the load's notes), or why the model
/// cannot run on what remains.
fn replace(ctx: &Context, model: &ModelArgs, slots: usize) -> serve::Replace {
    let (search, settings, options) = (ctx.search.clone(), ctx.settings.clone(), model.options());
    Box::new(move |lost: &[String], why: &str| {
        const LOST: &str = "lost while serving";
        let mut notes: Vec<String> = Vec::new();
        let loaded = tandem_engine::runtime::load::load_without(
            &search,
            &settings,
            &options,
            slots,
            lost,
            LOST,
            &mut |n| {
                if let tandem_engine::Notice::Note(m) | tandem_engine::Notice::Warning(m) = n {
                    // "faulty is unavailable (lost while serving); its ffn work runs on cpu":
                    // the unit is named once, at the start of the line.
                    let m = lost
                        .iter()
                        .find_map(|u| m.strip_prefix(&format!("{u} is unavailable ({LOST}); ")))
                        .map_or(m.clone(), str::to_string);
                    if !notes.contains(&m) {
                        notes.push(m);
                    }
                }
            },
            &mut |_, _| {},
        );
        let unit = lost.last().map_or("?", String::as_str);
        match loaded {
            Ok(l) => {
                let units = l.session.unit_names().join(", ");
                let went = if notes.is_empty() {
                    String::new()
                } else {
                    format!(": {}", notes.join("; "))
                };
                eprintln!("unit {unit} lost ({why}); the model now runs on {units}{went}");
                Ok(l.session)
            }
            Err(e) => {
                eprintln!(
                    "unit {unit} lost ({why}); the model cannot be placed on the units that \
                     remain ({e}); new requests get 503"
                );
                Err(e.to_string())
            }
        }
    })
}

/// The addresses `host` (an address or a name) and `port` resolve to, loopback first.
fn listen_addrs(host: &str, port: u16) -> anyhow::Result<Vec<SocketAddr>> {
    // `[::1]`, as URLs write it, is an address too.
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let mut addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .with_context(|| format!("--host {host}: not an address, and the name does not resolve"))?
        .collect();
    if addrs.is_empty() {
        anyhow::bail!("--host {host}: the name resolves to no address");
    }
    // IPv4 first: `localhost` is then 127.0.0.1, which every client tries.
    addrs.sort_by_key(|a| !a.is_ipv4());
    Ok(addrs)
}

/// Resolves at Ctrl-C or SIGTERM: new requests are refused from then on, running ones get
/// `grace` to finish before they are cancelled.
async fn shutdown(handle: Handle, grace: Duration) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    eprintln!(
        "shutting down: finishing running requests (at most {} s)",
        grace.as_secs()
    );
    handle.shut_down();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        handle.cancel_all();
    });
}

/// The model's name: its file or directory name without the extension, or the default
/// model's.
fn model_name(args: &ModelArgs) -> String {
    let path = args
        .model
        .clone()
        .unwrap_or_else(|| tandem_engine::DEFAULT_MODEL_FILE.into());
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}
