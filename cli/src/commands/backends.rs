//! `engine backends`: every plugin found, its device, and why any is unavailable.

use std::io::Write;

use crate::Context;

/// Flags of `engine backends`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let discovery = ctx.search.discover();
    let reports = tandem_engine::backend_report(&discovery, |name| ctx.settings.backend_options(name));
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "search_path": ctx.search.dirs,
            "backends": reports,
            "shadowed": discovery.shadowed,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    let width = reports.iter().map(|r| r.name.len()).max().unwrap_or(7).max(7);
    writeln!(out, "{:width$}  {:11}  DEVICE / REASON", "BACKEND", "STATUS")?;
    for r in &reports {
        let (status, detail) = match (&r.info, &r.reason) {
            (Some(info), _) => (
                "available",
                format!("{} [{}]", info.device, info.features.join(", ")),
            ),
            (None, Some(reason)) => ("unavailable", reason.clone()),
            (None, None) => ("unavailable", String::new()),
        };
        writeln!(out, "{:width$}  {status:11}  {detail}", r.name)?;
    }
    if reports.is_empty() {
        writeln!(out, "(no plugins found)")?;
    }
    let dirs: Vec<String> = ctx.search.dirs.iter().map(|d| d.display().to_string()).collect();
    writeln!(out, "searched: {}", dirs.join(", "))?;
    for s in &discovery.shadowed {
        writeln!(
            out,
            "shadowed by an earlier plugin of the same name: {}",
            s.display()
        )?;
    }
    Ok(())
}
