//! `engine perplexity`: perplexity of a text file, computed as llama.cpp's tool does: the
//! tokens are cut into chunks of `--context` tokens, each starting with BOS, and only the second
//! half of each chunk is scored (every scored token has at least half a context before it).
//! With `--kl-divergence-base FILE` it also saves each scored token's top `--kl-top-k` tokens;
//! with `--kl-divergence FILE` it compares this run's distributions with such a file
//! (`tandem_engine::bench::divergence`), as `llama-perplexity --kl-divergence` does.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context as _};

use super::load::{load, ModelArgs};
use crate::Context;
use tandem_engine::bench::divergence::{self, token_hash, Header, Reference, ReferenceWriter};
use tandem_engine::Step;

/// Flags of `engine perplexity`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file.
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk.
    #[arg(long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Score at most this many chunks (0: all).
    #[arg(long, default_value_t = 0)]
    chunks: usize,
    /// Save this run's next-token distributions (each scored token's `--kl-top-k` most likely
    /// tokens) to FILE, the reference a later `--kl-divergence FILE` compares against.
    #[arg(long, value_name = "FILE", conflicts_with = "kl_divergence")]
    kl_divergence_base: Option<PathBuf>,
    /// Compare this run's next-token distributions with the reference FILE (made by
    /// `--kl-divergence-base` over the same model, text, --ctx-size and --chunks): KL divergence,
    /// top-token agreement, both perplexities.
    #[arg(long, value_name = "FILE")]
    kl_divergence: Option<PathBuf>,
    /// Tokens per scored token the reference keeps (the divergence is over these and "any other
    /// token", a lower bound of the full one).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    kl_top_k: u32,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let n_ctx = args.ctx_size;
    if n_ctx < 4 {
        bail!("--ctx-size must be at least 4");
    }
    let mut margs_context = args.model.context;
    if margs_context.is_none_or(|c| c < n_ctx) {
        margs_context = Some(n_ctx);
    }
    let model_args = ModelArgs {
        context: margs_context,
        ..args.model.clone()
    };
    let mut loaded = load(ctx, &model_args, 1)?;
    let tokens = loaded.tokenizer.encode(&text, false)?;
    let bos = loaded.tokenizer.bos_id();
    let available = tokens.len() / n_ctx;
    let n_chunks = if args.chunks == 0 {
        available
    } else {
        args.chunks.min(available)
    };
    if n_chunks == 0 {
        let n = tokens.len();
        let fix = if n >= 4 {
            format!("a text of at least {n_ctx} tokens, or --ctx-size {n} or less")
        } else {
            "a text of at least 4 tokens (the smallest --ctx-size)".to_string()
        };
        bail!(
            "{}: {n} tokens, fewer than one chunk of {n_ctx} (--ctx-size); use {fix}",
            args.file.display()
        );
    }
    let vocab = loaded.session.vocab();
    let first = n_ctx / 2;
    // The reference to write or to compare with.
    let header = Header {
        vocab: vocab as u32,
        top_k: args.kl_top_k.min(vocab as u32),
        ctx_size: n_ctx as u32,
        chunks: n_chunks as u32,
        tokens_hash: token_hash(&tokens[..n_chunks * n_ctx]),
        count: (n_chunks * (n_ctx - first)) as u64,
    };
    let mut base = match &args.kl_divergence_base {
        Some(path) => Some(ReferenceWriter::create(path, &header)?),
        None => None,
    };
    // The k the divergence is over: the reference's.
    let mut shown_k = header.top_k;
    let mut reference = match &args.kl_divergence {
        Some(path) => {
            let r = Reference::open(path)?;
            let h = r.header;
            r.expect("vocabulary", h.vocab.into(), header.vocab.into())?;
            r.expect("--ctx-size", h.ctx_size.into(), header.ctx_size.into())?;
            r.expect("--chunks", h.chunks.into(), header.chunks.into())?;
            r.expect(
                "token hash (text and tokenizer)",
                h.tokens_hash,
                header.tokens_hash,
            )?;
            r.expect("scored token count", h.count, header.count)?;
            shown_k = h.top_k;
            Some(r)
        }
        None => None,
    };
    let (mut kls, mut same, mut nll_ref, mut nll_run) = (Vec::new(), 0usize, Vec::new(), Vec::new());
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut out = std::io::stdout().lock();
    let t0 = std::time::Instant::now();
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        loaded.session.reset(0);
        let mut pos = 0;
        // Rows that score nothing (before `first - 1`) go in whole steps; scored rows in steps
        // of a bounded slice of logits.
        let (whole, scoring) = (loaded.session.chunk(), loaded.session.scoring_chunk());
        while pos < n_ctx {
            let len = if pos + 1 < first {
                whole.min(first - 1 - pos)
            } else {
                scoring
            };
            let end = (pos + len).min(n_ctx);
            let piece = &chunk[pos..end];
            // Rows whose logits predict a scored token: positions first-1 ..= n_ctx-2.
            let select: Vec<u32> = (pos..end)
                .filter(|&p| p + 1 >= first && p + 1 < n_ctx)
                .map(|p| (p - pos) as u32)
                .collect();
            let sel = if select.is_empty() {
                vec![(end - pos - 1) as u32]
            } else {
                select.clone()
            };
            let slots = vec![0u32; piece.len()];
            let logits = loaded.session.step(Step::prefill(piece, &slots, &sel))?;
            for (i, &row) in select.iter().enumerate() {
                let target = chunk[pos + row as usize + 1] as usize;
                let l = &logits[i * vocab..(i + 1) * vocab];
                let k = if base.is_some() { header.top_k as usize } else { 0 };
                let (v, top) = divergence::score(l, target, k);
                nll += v;
                nll2 += v * v;
                count += 1;
                if let Some(w) = base.as_mut() {
                    w.push(v, &top)?;
                }
                if let Some(r) = reference.as_mut() {
                    let (ref_nll, ref_top) = r.next_token()?;
                    let (kl, same_top) = divergence::kl_top_k(&ref_top, l);
                    kls.push(kl);
                    same += usize::from(same_top);
                    nll_ref.push(ref_nll);
                    nll_run.push(v);
                }
            }
            pos = end;
        }
        if !args.json {
            write!(out, "[{}]{:.4} ", c + 1, (nll / count as f64).exp())?;
            out.flush()?;
        }
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    // Standard error of the mean NLL, propagated to the perplexity as llama.cpp does.
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let err = ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt();
    let secs = t0.elapsed().as_secs_f64();
    if let Some(w) = base {
        w.finish()?;
    }
    let kl = reference.map(|_| divergence::summarize(&kls, same, &nll_ref, &nll_run));
    if args.json {
        let mut doc = serde_json::json!({
            "file": args.file, "chunks": n_chunks, "ctx_size": n_ctx, "scored_tokens": count,
            "perplexity": ppl, "perplexity_error": err, "seconds": secs,
            "tokens_per_second": (n_chunks * n_ctx) as f64 / secs.max(1e-9),
        });
        if let Some(d) = &kl {
            doc["kl_divergence"] = serde_json::to_value(d)?;
            doc["kl_divergence"]["top_k"] = shown_k.into();
        }
        if let Some(p) = &args.kl_divergence_base {
            doc["kl_divergence_base"] = serde_json::json!({"file": p, "top_k": header.top_k});
        }
        writeln!(out, "{doc}")?;
    } else {
        writeln!(out)?;
        writeln!(
            out,
            "Final estimate: PPL = {ppl:.4} +/- {err:.5} ({n_chunks} chunks of {n_ctx}, {secs:.1} s)"
        )?;
        if let Some(p) = &args.kl_divergence_base {
            writeln!(
                out,
                "Saved the top {} tokens of {count} scored tokens to {}",
                header.top_k,
                p.display()
            )?;
        }
        if let Some(d) = &kl {
            write_divergence(&mut out, d, shown_k)?;
        }
    }
    Ok(())
}

/// The comparison as llama.cpp's `llama-perplexity --kl-divergence` prints it.
fn write_divergence(out: &mut impl Write, d: &divergence::Divergence, top_k: u32) -> std::io::Result<()> {
    let ratio = d.ln_ppl_ratio.exp();
    writeln!(out, "====== Perplexity statistics ======")?;
    writeln!(out, "Mean PPL(Q)                   : {:.6}", d.ppl)?;
    writeln!(out, "Mean PPL(base)                : {:.6}", d.ppl_reference)?;
    writeln!(
        out,
        "Mean ln(PPL(Q)/PPL(base))     : {:.6} +/- {:.6}",
        d.ln_ppl_ratio, d.ln_ppl_ratio_error
    )?;
    writeln!(
        out,
        "Mean PPL(Q)/PPL(base)         : {:.6} +/- {:.6}",
        ratio,
        ratio * d.ln_ppl_ratio_error
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "====== KL divergence statistics (over each base token's top {top_k} and the rest) ======"
    )?;
    writeln!(out, "Mean    KLD: {:.6} +/- {:.6}", d.kl_mean, d.kl_mean_error)?;
    writeln!(out, "Maximum KLD: {:.6}", d.kl_max)?;
    writeln!(out, "99.0%   KLD: {:.6}", d.kl_p99)?;
    writeln!(out, "Median  KLD: {:.6}", d.kl_median)?;
    writeln!(
        out,
        "Same top p : {:.3} +/- {:.3} % ({} tokens)",
        100.0 * d.same_top,
        100.0 * d.same_top_error,
        d.tokens
    )
}
