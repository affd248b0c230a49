//! `engine loadgen`: load on a running `engine serve`, bounded in requests and time and
//! restricted to loopback addresses. For each number of concurrent clients, every client sends
//! streamed completions one after another until the level's request count or time is used up;
//! reported: aggregate generated tokens/s over the level's wall time, time to first token and
//! inter-token latency (p50, p99), as the clients saw them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::Context;

/// Most requests per level.
const MAX_REQUESTS: usize = 4096;
/// Most seconds per level.
const MAX_SECONDS: u64 = 600;
/// Most concurrent clients.
const MAX_CLIENTS: usize = 256;

/// Flags of `engine loadgen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The server (loopback only): http://127.0.0.1:PORT.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Concurrent clients, one level each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Requests per level (at most 4096); at least one per client is sent.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Seconds per level (at most 600): no request starts after it.
    #[arg(long, default_value_t = 120)]
    duration: u64,
    /// Tokens each request generates at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// The prompt.
    #[arg(long, default_value = "Write a short story about a lighthouse keeper.")]
    prompt: String,
    /// Start each request's prompt with its number (`#17: `), so that no two requests share
    /// more than a token or two of prefix: a server can reuse no request's prompt for another.
    #[arg(long)]
    distinct_prompts: bool,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

/// What one request measured.
struct Sample {
    tokens: usize,
    ttft: Option<f64>,
    itl: Vec<f64>,
}

/// Runs the command.
pub fn run(_ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let addr = loopback(&args.url)?;
    if args.requests == 0 || args.requests > MAX_REQUESTS {
        bail!("--requests must be 1..={MAX_REQUESTS}");
    }
    if args.duration == 0 || args.duration > MAX_SECONDS {
        bail!("--duration must be 1..={MAX_SECONDS} seconds");
    }
    if args.clients.iter().any(|&c| c == 0 || c > MAX_CLIENTS) {
        bail!("--clients: each must be 1..={MAX_CLIENTS}");
    }
    let mut levels = Vec::new();
    for &clients in &args.clients {
        let level = measure(addr, args, clients)?;
        if !args.json {
            println!(
                "clients {clients:>3}: {:>4} requests, {:>6} tokens in {:>6.1} s = {:>7.1} tok/s; TTFT p50 {:>7.1} ms p99 {:>7.1} ms; ITL p50 {:>6.1} ms p99 {:>6.1} ms",
                level["requests"], level["generated_tokens"], level["seconds"].as_f64().unwrap_or(0.0),
                level["tokens_per_second"].as_f64().unwrap_or(0.0),
                level["ttft_ms"]["p50"].as_f64().unwrap_or(0.0), level["ttft_ms"]["p99"].as_f64().unwrap_or(0.0),
                level["itl_ms"]["p50"].as_f64().unwrap_or(0.0), level["itl_ms"]["p99"].as_f64().unwrap_or(0.0),
            );
        }
        levels.push(level);
    }
    if args.json {
        let doc = json!({
            "url": args.url, "max_tokens": args.max_tokens, "prompt": args.prompt,
            "distinct_prompts": args.distinct_prompts, "levels": levels,
        });
        println!("{doc}");
    }
    Ok(())
}

/// Request `n`'s prompt: `prompt`, after its number where every request's should differ.
fn request_prompt(prompt: &str, n: usize, distinct: bool) -> String {
    if distinct {
        format!("#{n}: {prompt}")
    } else {
        prompt.to_string()
    }
}

/// The server's address, refusing anything but loopback.
fn loopback(url: &str) -> anyhow::Result<SocketAddr> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--url {url}: expected http://HOST:PORT"))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .with_context(|| format!("--url {url}: cannot resolve {hostport}"))?
        .collect();
    match addrs.first() {
        Some(a) if addrs.iter().all(|a| a.ip().is_loopback()) => Ok(*a),
        _ => bail!("--url {url}: the load generator only talks to loopback addresses"),
    }
}

fn measure(addr: SocketAddr, args: &Args, clients: usize) -> anyhow::Result<Value> {
    let issued = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    let total = args.requests.max(clients);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(args.duration);
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| loop {
                let n = issued.fetch_add(1, Ordering::SeqCst);
                if n >= total || Instant::now() >= deadline {
                    break;
                }
                let prompt = request_prompt(&args.prompt, n, args.distinct_prompts);
                let body = json!({
                    "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
                    "stream": true,
                });
                match one(addr, args.api_key.as_deref(), &body) {
                    Ok(sample) => samples.lock().map(|mut v| v.push(sample)).unwrap_or(()),
                    Err(e) => errors.lock().map(|mut v| v.push(format!("{e:#}"))).unwrap_or(()),
                }
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    let errors = errors.into_inner().unwrap_or_default();
    if let Some(e) = errors.first() {
        bail!("{} of the requests failed; the first: {e}", errors.len());
    }
    let samples = samples.into_inner().unwrap_or_default();
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<f64> = samples.iter().filter_map(|s| s.ttft).collect();
    let mut itl: Vec<f64> = samples.iter().flat_map(|s| s.itl.iter().copied()).collect();
    Ok(json!({
        "clients": clients,
        "requests": samples.len(),
        "generated_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens as f64 / seconds.max(1e-9),
        "ttft_ms": percentiles(&mut ttft),
        "itl_ms": percentiles(&mut itl),
    }))
}

/// p50 and p99 of `v` (seconds), in milliseconds.
fn percentiles(v: &mut [f64]) -> Value {
    if v.is_empty() {
        return json!({"p50": null, "p99": null});
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] * 1e3;
    json!({"p50": at(0.5), "p99": at(0.99)})
}

/// Tokens one streamed chunk carries: its `token_ids` (tandem's streams), else one per chunk
/// whose choice has text and no finish reason (servers that send a chunk per token without
/// ids, as llama-server does).
fn stream_tokens(chunk: &Value) -> usize {
    let choice = &chunk["choices"][0];
    match choice["token_ids"].as_array() {
        Some(ids) => ids.len(),
        None => usize::from(choice["text"].is_string() && choice["finish_reason"].is_null()),
    }
}

/// One streamed completion, timed from the request's first byte.
fn one(addr: SocketAddr, key: Option<&str>, body: &Value) -> anyhow::Result<Sample> {
    let body = body.to_string();
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(MAX_SECONDS)))?;
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut chunked = false;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        let l = line.to_ascii_lowercase();
        chunked |= l.starts_with("transfer-encoding:") && l.contains("chunked");
    }
    if status != "200" {
        let mut rest = String::new();
        let _ = r.read_to_string(&mut rest);
        bail!("status {status}: {}", rest.trim());
    }
    if !chunked {
        bail!("expected a chunked event stream");
    }
    let mut sample = Sample {
        tokens: 0,
        ttft: None,
        itl: Vec::new(),
    };
    let mut last = t0;
    let mut pending = String::new();
    // Chunked framing: a size line, the data, CRLF.
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        let size = usize::from_str_radix(line.trim(), 16).with_context(|| format!("chunk size {line:?}"))?;
        if size == 0 {
            break;
        }
        let mut data = vec![0; size + 2];
        r.read_exact(&mut data)?;
        pending.push_str(&String::from_utf8_lossy(&data[..size]));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(payload) = event.trim().strip_prefix("data:") else {
                continue;
            };
            let payload = payload.trim();
            if payload == "[DONE]" {
                return Ok(sample);
            }
            let v: Value = serde_json::from_str(payload).context("a chunk that is not JSON")?;
            if v.get("error").is_some() {
                bail!("error in the stream: {v}");
            }
            let n = stream_tokens(&v);
            if n > 0 {
                let now = Instant::now();
                match sample.ttft {
                    None => sample.ttft = Some((now - t0).as_secs_f64()),
                    Some(_) => sample.itl.push((now - last).as_secs_f64()),
                }
                last = now;
                sample.tokens += n;
            }
        }
    }
    bail!("the stream ended without [DONE]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_prompts_differ_from_their_first_characters() {
        assert_eq!(request_prompt("Hi.", 3, false), "Hi.");
        let (a, b) = (request_prompt("Hi.", 3, true), request_prompt("Hi.", 17, true));
        assert!(a.ends_with("Hi.") && b.ends_with("Hi."));
        assert_eq!(a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count(), 1);
    }

    #[test]
    fn stream_chunks_count_their_ids_or_one_token_of_text() {
        let chunk = |v: Value| stream_tokens(&v);
        assert_eq!(
            chunk(json!({"choices": [{"text": "ab", "token_ids": [5, 6]}]})),
            2
        );
        assert_eq!(chunk(json!({"choices": [{"text": "", "token_ids": []}]})), 0);
        // llama-server: one token per chunk, the last one only says why it ended.
        assert_eq!(
            chunk(json!({"choices": [{"text": " the", "finish_reason": null}]})),
            1
        );
        assert_eq!(
            chunk(json!({"choices": [{"text": "", "finish_reason": "length"}]})),
            0
        );
        assert_eq!(chunk(json!({"usage": {}})), 0);
    }
}
