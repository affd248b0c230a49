//! `engine`: tandem's command line.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tandem_engine::{PluginSearch, Settings};

/// tandem: Gemma 3 inference on CPUs, GPUs and NPUs.
#[derive(Debug, Parser)]
#[command(name = "engine", version, about)]
struct Cli {
    /// A tandem.toml config file (plugin directories, placement, backend options).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Also search this directory for backend plugins (repeatable).
    #[arg(long = "plugin-dir", global = true)]
    plugin_dirs: Vec<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// Every subcommand takes negative numbers as values (`--temperature -1`), so that they reach
/// the range checks and their messages instead of being read as unknown flags.
#[derive(Debug, Subcommand)]
enum Command {
    /// List every backend plugin found, its device, and why any is unavailable.
    #[command(allow_negative_numbers = true)]
    Backends(commands::backends::Args),
    /// Generate text from a prompt or token ids.
    #[command(allow_negative_numbers = true)]
    Run(commands::run::Args),
    /// Print the logits of every position of a token sequence.
    #[command(allow_negative_numbers = true)]
    Logits(commands::logits::Args),
    /// Chat interactively, one user turn per input line.
    #[command(allow_negative_numbers = true)]
    Chat(commands::chat::Args),
    /// Print the token ids the model sees for a text.
    #[command(allow_negative_numbers = true)]
    Tokenize(commands::tokenize::Args),
    /// Perplexity of a text file (llama.cpp's method).
    #[command(allow_negative_numbers = true)]
    Perplexity(commands::perplexity::Args),
    /// Write a random-weight Gemma 3 GGUF of a real shape.
    #[command(allow_negative_numbers = true)]
    Synth(commands::synth::Args),
    /// Show where every node runs (`--backend A+B`, the config's [placement]) and what crosses
    /// between units.
    #[command(allow_negative_numbers = true)]
    Placement(commands::placement::Args),
    /// Measure prefill and decode speed against the hardware's limits, or render saved results.
    #[command(allow_negative_numbers = true)]
    Bench(commands::bench::Args),
    /// Serve the model over HTTP with OpenAI's API, batching concurrent requests.
    #[command(allow_negative_numbers = true)]
    Serve(commands::serve::Args),
    /// Load a running `engine serve` (loopback only, bounded): tokens/s, TTFT, inter-token
    /// latency per number of concurrent clients.
    #[command(allow_negative_numbers = true)]
    Loadgen(commands::loadgen::Args),
}

/// What every command gets: the settings and where plugins are.
pub struct Context {
    /// The config file's settings (defaults without one).
    pub settings: Settings,
    /// The plugin search path.
    pub search: PluginSearch,
}

fn main() -> ExitCode {
    // Before any thread starts: it may set an environment variable.
    tandem_engine::prepare_for_gpu_probes();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of standard output went away (`engine run ... | head -c 10`): it has all it
        // wanted, so the command ends quietly, as `cat` does.
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = match &cli.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    let mut extra = settings.plugin_dirs.clone();
    extra.extend(cli.plugin_dirs.iter().cloned());
    let search = PluginSearch::standard(&extra);
    // A memory limit binds every backend on its device (nothing is probed without one).
    let settings = if settings.has_memory_limit() {
        let discovery = search.discover();
        tandem_engine::runtime::device_budget::share_limits(
            &discovery,
            &settings,
            &mut commands::load::print_notice,
        )
    } else {
        settings
    };
    let ctx = Context { search, settings };
    match cli.command {
        Command::Backends(args) => commands::backends::run(&ctx, &args),
        Command::Run(args) => commands::run::run(&ctx, &args),
        Command::Logits(args) => commands::logits::run(&ctx, &args),
        Command::Chat(args) => commands::chat::run(&ctx, &args),
        Command::Tokenize(args) => commands::tokenize::run(&ctx, &args),
        Command::Perplexity(args) => commands::perplexity::run(&ctx, &args),
        Command::Synth(args) => commands::synth::run(&ctx, &args),
        Command::Bench(args) => commands::bench::run(&ctx, &args),
        Command::Placement(args) => commands::placement::run(&ctx, &args),
        Command::Serve(args) => commands::serve::run(&ctx, &args),
        Command::Loadgen(args) => commands::loadgen::run(&ctx, &args),
    }
}

/// Whether the error is a write to a pipe whose reader has closed it.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The error and its causes on one line, skipping causes the message already contains (typed
/// errors often print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
    }
    msg.replace('\n', " ")
}
