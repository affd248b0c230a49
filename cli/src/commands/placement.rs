//! `engine placement`: where every node of the step graph runs and why, what each unit holds,
//! and what crosses between units, for the placement `--backend` and the config ask for. Nothing
//! of the model is uploaded (under `--backend auto` with image input on two or more hardware
//! units, the vision tower cut to one encoder layer is, to time it: see
//! `tandem_engine::runtime::vision_plan`). The engine plans and reports ([`tandem_engine::Planned::report`]); the text is
//! rendered here ([`placement_text`]), the JSON is the report serialised.

use std::io::Write;

use tandem_cli::report::placement_text;
use tandem_engine::plan;

use super::load::{print_notice, ModelArgs};
use crate::Context;

/// Flags of `engine placement`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let planned = plan(
        &ctx.search,
        &args.model.settings(&ctx.settings),
        &args.model.options(),
        1,
        &mut print_notice,
    )?;
    let report = planned.report();
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        write!(out, "{}", placement_text(&report))?;
    }
    Ok(())
}
