//! `engine bench`: prefill and decode speed per batch size, time to first token, per-token
//! latency, peak memory, and the achieved fractions of the copy bandwidth and matrix-product
//! peak that the same run measures (`tandem_engine::bench::run`), printed as a table or JSON.
//! `--report DIR RESULT.json...` renders saved results (`tandem_cli::report`). The JSON is the
//! engine's [`BenchResult`] serialised, and follows `docs/bench-schema.json` (`tandem-bench/1`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use tandem_engine::bench::results::{BenchResult, ImageRun, SpeculationRun};
use tandem_engine::bench::run::{BenchEvent, BenchOptions};

use super::load::{load, load_with_settings, read_images, ModelArgs};
use super::progress::{self, Progress};
use super::speculate::DraftArgs;
use crate::Context;

/// Flags of `engine bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Benchmark a random-weight model of a real shape instead (gemma3-270m, gemma3-1b, ...).
    #[arg(long, conflicts_with = "report")]
    synthetic: Option<String>,
    /// Storage type of the synthetic model's matrices (f16, bf16, q8_0, q4_k).
    #[arg(long, default_value = "q4_k")]
    dtype: String,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Batch sizes (sequences decoded together), comma-separated.
    #[arg(long, default_value = "1")]
    batch: String,
    /// Timed repetitions per batch size (after one warm-up).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Also measure speculative decoding's verification cost curve: one step of 1..N rows of
    /// one sequence against a one-row step (its own session, after the batch sizes), with the
    /// speedups it predicts at acceptance 0.5-0.9 (docs/speculative.md).
    #[arg(long, default_value_t = 0, value_name = "N")]
    verify_rows: usize,
    /// With a drafter (--draft ngram, --draft-model M): also continue this text greedily by
    /// --gen-tokens, with and without speculative decoding (rates, speedup, acceptance,
    /// tokens per target step).
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    #[command(flatten)]
    draft: DraftArgs,
    /// Also measure image input with this image (PNG, JPEG, WebP): the vision tower's
    /// encoding and the prefill of the image with a short text, medians of --repeat after a
    /// warm-up. The model needs a vision tower (--mmproj, or a Hugging Face multimodal
    /// directory); with --synthetic, a random one of the shape is written beside the model.
    #[arg(long, value_name = "FILE")]
    image: Option<PathBuf>,
    /// Per-op times: on the GPU backends device timestamps after every node (which serialise the
    /// GPU's work: a profiled run measures where time goes, not the speed), on the CPU the wall
    /// time of every node.
    #[arg(long)]
    profile: bool,
    /// Print the JSON result (otherwise a table).
    #[arg(long)]
    json: bool,
    /// Also write the JSON result to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Render saved results instead: `engine bench --report DIR A.json B.json ...`.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Result files for `--report`.
    results: Vec<PathBuf>,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.report {
        if args.results.is_empty() {
            bail!("--report DIR needs result files: engine bench --report DIR A.json B.json");
        }
        let results = args
            .results
            .iter()
            .map(|p| tandem_cli::report::load_result(p))
            .collect::<Result<Vec<_>, _>>()?;
        let files = tandem_cli::report::write_report(&results, dir)?;
        for f in [&files.markdown, &files.tokens_per_s_svg, &files.roofline_svg] {
            println!("wrote {}", f.display());
        }
        return Ok(());
    }
    let batches: Vec<usize> = args
        .batch
        .split(',')
        .map(|b| b.trim().parse::<usize>().ok().filter(|&b| b > 0))
        .collect::<Option<_>>()
        .with_context(|| format!("--batch: '{}' is not a list of positive sizes", args.batch))?;
    if args.prompt_tokens == 0 || args.gen_tokens < 2 || args.repeat == 0 {
        bail!("--prompt-tokens and --repeat must be at least 1, --gen-tokens at least 2");
    }
    args.draft.check()?;
    if args.draft.enabled() != args.prompt_file.is_some() {
        bail!("--prompt-file and a drafter (--draft ngram, --draft-model M) go together");
    }
    let options = BenchOptions {
        // The batch sizes run on text: images are measured on their own (--image).
        model: tandem_engine::ModelOptions {
            images: 0,
            ..args.model.options()
        },
        synthetic: args.synthetic.clone(),
        dtype: args.dtype.clone(),
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        batches,
        repeat: args.repeat,
        verify_rows: args.verify_rows,
    };
    let total_tokens = options.total_decode_tokens();
    let mut progress = Progress::new(progress::load_label(args.model.model.as_deref()));
    let mut settings = args.model.settings(&ctx.settings);
    if args.profile {
        for name in ["cpu", "vulkan", "wgpu"] {
            settings.set_backend_option(name, "profile", "true");
        }
    }
    let result = tandem_engine::bench::run::run(&ctx.search, &settings, &options, &mut |event| match event {
        BenchEvent::Notice(n) => progress.notice(n),
        BenchEvent::WritingSynthetic(path) => eprintln!("writing {}", path.display()),
        BenchEvent::Loading { done, total } => progress.bytes(done, total),
        BenchEvent::Loaded => progress.finish(),
        BenchEvent::Tokens(n) => progress.tokens(n, total_tokens),
    });
    // The progress line is cleared before the table prints, or the table's first line starts
    // after it.
    progress.finish();
    let mut result = result?;
    if let Some(file) = &args.prompt_file {
        result.speculation = Some(speculation(ctx, args, file)?);
    }
    if let Some(file) = &args.image {
        result.image = Some(image_run(ctx, args, &settings, file)?);
    }
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    let mut o = std::io::stdout().lock();
    if args.json {
        writeln!(o, "{}", serde_json::to_string_pretty(&result)?)?;
    } else {
        write!(o, "{}", table(&result))?;
    }
    Ok(())
}

/// The result as a table: a header line, then a line per batch size with its profile's five
/// costliest op kinds under it.
///
/// The names are printed as JSON strings (quoted) and the batch column unpadded, as the table
/// always has been (it used to print `serde_json::Value`s, which ignore widths).
/// `file` continued by --gen-tokens with and without the flags' drafter, on the model and
/// backend of the run.
fn speculation(ctx: &Context, args: &Args, file: &std::path::Path) -> anyhow::Result<SpeculationRun> {
    let text = std::fs::read_to_string(file).with_context(|| format!("--prompt-file {}", file.display()))?;
    // The model the run measured: a synthetic one is where the run wrote it.
    let mut model = args.model.clone();
    if let Some(shape) = &args.synthetic {
        let dtype = args.dtype.parse().map_err(|e| anyhow::anyhow!("--dtype: {e}"))?;
        model.model = Some(tandem_engine::bench::run::synthetic_path(shape, dtype));
    }
    let mut loaded = load(ctx, &model, 1)?;
    let prompt = loaded.tokenizer.encode(&text, true)?;
    let mut built = args
        .draft
        .build(ctx, &model)?
        .context("a drafter (--draft ngram, --draft-model M)")?;
    let mut spec = args.draft.speculator(&mut built, &loaded)?;
    Ok(tandem_engine::bench::verify::speculation(
        &mut loaded.session,
        &loaded.tokenizer,
        &prompt,
        args.gen_tokens,
        args.repeat,
        &mut spec,
    )?)
}

/// `file` encoded and prefilled with a short text, on the model and backend of the run and
/// under its `settings` (with `--profile`, the tower's per-op times too): the vision tower's
/// time and the image prompt's prefill rate.
fn image_run(
    ctx: &Context,
    args: &Args,
    settings: &tandem_engine::Settings,
    file: &std::path::Path,
) -> anyhow::Result<ImageRun> {
    let mut model = args.model.clone();
    if let Some(shape) = &args.synthetic {
        let dtype = args.dtype.parse().map_err(|e| anyhow::anyhow!("--dtype: {e}"))?;
        let path = tandem_engine::bench::run::synthetic_path(shape, dtype);
        if model.mmproj.is_none() {
            let mmproj = path.with_extension("mmproj.gguf");
            if !mmproj.exists() {
                let shape = shape.parse().map_err(|e| anyhow::anyhow!("--synthetic: {e}"))?;
                eprintln!("writing {}", mmproj.display());
                tandem_engine::write_synthetic_mmproj(shape, &mmproj, 0, &mut |_, _| {})?;
            }
            model.mmproj = Some(mmproj);
        }
        model.model = Some(path);
    }
    let inputs = read_images(&[file.to_path_buf()])?;
    let mut loaded = load_with_settings(ctx, &model, settings, model.options_for(true), 1)?;
    let images = loaded
        .images
        .as_mut()
        .context("the model was loaded without image input (--max-images 0)")?;
    let vocab = loaded.session.vocab();
    let (mut encode, mut prefill, mut first) = (Vec::new(), Vec::new(), Vec::new());
    let mut prompt_tokens = 0;
    for _ in 0..=args.repeat {
        let t0 = std::time::Instant::now();
        let places = images.place(&mut loaded.session, &inputs, 1)?;
        let encoded = t0.elapsed().as_secs_f64();
        let ids = images.tokenize(&loaded.tokenizer, "Describe this image.", &places, true, vocab)?;
        loaded.session.reset(0);
        let t1 = std::time::Instant::now();
        loaded.session.prefill(0, &ids, false)?;
        let prefilled = t1.elapsed().as_secs_f64();
        images.release(&places);
        prompt_tokens = ids.len();
        encode.push(encoded * 1e3);
        prefill.push(ids.len() as f64 / prefilled.max(1e-9));
        first.push((encoded + prefilled) * 1e3);
    }
    let profile = if args.profile {
        let nodes = images.profile_last_encoding()?;
        Some(tandem_engine::bench::results::OpTime::by_op(
            nodes.iter().map(|n| (n.op.as_str(), n.seconds)),
        ))
    } else {
        None
    };
    // The first round is the warm-up.
    let median = |v: &mut Vec<f64>| {
        v.remove(0);
        tandem_engine::bench::results::median(v)
    };
    Ok(ImageRun {
        image: file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        tower_unit: images.unit_name().to_string(),
        tokens_per_image: images.tokens_per_image(),
        prompt_tokens,
        encode_ms: median(&mut encode),
        prefill_tokens_per_s: median(&mut prefill),
        first_logits_ms: median(&mut first),
        profile,
    })
}

fn table(r: &BenchResult) -> String {
    use std::fmt::Write as _;
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} on {} ({}), copy {:.1} GB/s, matmul peak {:.1} GFLOP/s",
        quoted(&r.model.name),
        quoted(&r.backend.name),
        quoted(&r.backend.device),
        r.limits.copy_bandwidth_bytes_per_s / 1e9,
        r.limits.peak_flops / 1e9
    );
    let _ = writeln!(
        o,
        "batch  prefill tok/s  decode tok/s  ttft ms  p50 ms  p99 ms  bw frac  flop frac"
    );
    for run in &r.runs {
        let _ = writeln!(
            o,
            "{}  {:>13.1}  {:>12.1}  {:>7.1}  {:>6.1}  {:>6.1}  {:>7.3}  {:>9.3}",
            run.batch,
            run.prefill_tokens_per_s.median,
            run.decode_tokens_per_s.median,
            run.ttft_ms.median,
            run.token_latency_ms.p50,
            run.token_latency_ms.p99,
            run.decode_bandwidth_fraction,
            run.prefill_flops_fraction
        );
        if let Some(p) = &run.profile {
            for (step, ops) in [("prefill", &p.prefill), ("decode", &p.decode)] {
                let ops: Vec<String> = ops
                    .iter()
                    .take(5)
                    .map(|op| format!("{} {:.3} ms", op.op, op.seconds * 1e3))
                    .collect();
                let _ = writeln!(o, "       {step} device time: {}", ops.join(", "));
            }
        }
    }
    if let Some(s) = &r.speculation {
        let _ = writeln!(
            o,
            "speculation ({}{}): {:.1} / {:.1} tok/s = {:.2}x, acceptance {:.2}, {:.2} tokens per target step, {} the plain tokens",
            s.drafter,
            if s.overlap { ", running ahead" } else { "" },
            s.tokens_per_s,
            s.plain_tokens_per_s,
            s.speedup,
            s.acceptance,
            s.tokens_per_target_step,
            if s.same_tokens { "the same as" } else { "NOT" }
        );
    }
    if let Some(im) = &r.image {
        let _ = writeln!(
            o,
            "image {} ({} tokens, tower on {}): encode {:.1} ms, prefill of {} tokens {:.1} tok/s, first logits {:.1} ms",
            quoted(&im.image),
            im.tokens_per_image,
            im.tower_unit,
            im.encode_ms,
            im.prompt_tokens,
            im.prefill_tokens_per_s,
            im.first_logits_ms
        );
    }
    if let Some(curve) = &r.verify_curve {
        let _ = writeln!(
            o,
            "verification: one step of N rows of one sequence against one row"
        );
        let _ = writeln!(o, "rows        ms  ratio");
        for p in curve {
            let _ = writeln!(o, "{:>4}  {:>8.3}  {:>5.2}", p.rows, p.ms, p.ratio);
        }
        let _ = writeln!(
            o,
            "predicted speedup over plain decode (a draft that costs the target nothing: on another unit, running ahead; best depth):"
        );
        for a in [0.5, 0.6, 0.7, 0.8, 0.9] {
            let (s, k) = tandem_engine::bench::verify::predicted_speedup(curve, a, 0.0);
            let _ = writeln!(o, "  acceptance {a:.1}: {s:.2}x at {k} drafts");
        }
    }
    o
}
