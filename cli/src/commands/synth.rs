//! `engine synth`: a random-weight Gemma 3 GGUF of a real shape, for benchmarks where the real
//! weights cannot travel.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use tandem_engine::{write_synthetic_gguf, write_synthetic_mmproj, SynthDtype, SynthShape};

use crate::Context;

/// Flags of `engine synth`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// gemma3-270m, gemma3-1b, gemma3-4b, gemma3-12b, gemma3-27b (or tiny).
    #[arg(long)]
    shape: String,
    /// f16, bf16, q8_0 or q4_k.
    #[arg(long, default_value = "q4_k")]
    dtype: String,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Overwrite `--out` (and `--mmproj`) if it exists.
    #[arg(long)]
    force: bool,
    /// Also write a random vision tower for the shape to this file, in llama.cpp's mmproj GGUF
    /// layout (4B, 12B, 27B and tiny have one).
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
}

/// Runs the command.
pub fn run(_ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let shape: SynthShape = args.shape.parse()?;
    let dtype: SynthDtype = args.dtype.parse()?;
    if args.mmproj.is_some() && !shape.has_vision() {
        anyhow::bail!(
            "--mmproj: Gemma 3 {} has no vision tower (4B, 12B and 27B have one; tiny for tests)",
            shape.name()
        );
    }
    for out in std::iter::once(&args.out).chain(&args.mmproj) {
        if !args.force && out.exists() {
            anyhow::bail!("{} exists; pass --force to overwrite it", out.display());
        }
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("writing {bar:40} {bytes}/{total_bytes} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let t0 = std::time::Instant::now();
    let report = write_synthetic_gguf(shape, dtype, &args.out, args.seed, &mut |done, total| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let say = |report: &tandem_engine::checkpoint::synth::SynthReport| {
        writeln!(
            std::io::stdout().lock(),
            "wrote {} ({} bytes, {} tensors, {} parameters) in {:.1} s",
            report.path.display(),
            report.bytes,
            report.tensors,
            report.params,
            t0.elapsed().as_secs_f64()
        )
    };
    say(&report)?;
    if let Some(path) = &args.mmproj {
        say(&write_synthetic_mmproj(shape, path, args.seed, &mut |_, _| {})?)?;
    }
    Ok(())
}
