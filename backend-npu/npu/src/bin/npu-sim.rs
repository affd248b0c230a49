//! `npu-sim`: the simulated answer to "on my Ryzen AI laptop, which placement of Gemma 3 is
//! fastest, and by how much?". SIMULATED: no NPU and no laptop iGPU ran.
//!
//! - `npu-sim` prints the laptop ranking: Gemma 3 1B and 4B on Strix and Krackan, prefill and
//!   decode at batch 1 and 8, every placement with the range the calibration error implies;
//! - `npu-sim --calibration` prints each published XDNA2 figure beside the model's prediction;
//! - `--json` prints either as JSON; `--legacy` prints the earlier per-op answer (`sim.rs`).
//!
//! The parameters and their sources are in `tandem_npu::params`.

use tandem_npu::calibration::{self, calibration, fit, max_error, rankings};
use tandem_npu::params;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    if let Some(bad) = args
        .iter()
        .find(|a| !["--calibration", "--json", "--legacy"].contains(&a.as_str()))
    {
        anyhow::bail!("unknown argument '{bad}' (npu-sim [--calibration] [--json] [--legacy])");
    }
    let p = calibration::calibrated();
    if has("--legacy") {
        legacy();
        return Ok(());
    }
    if has("--calibration") {
        let checks = calibration(p);
        let refit =
            fit(p).ok_or_else(|| anyhow::anyhow!("the calibration figures do not determine a fit"))?;
        if has("--json") {
            let v = serde_json::json!({
                "label": "SIMULATED: model predictions beside published figures; nothing ran on an NPU",
                "parameters": p,
                "refit": refit,
                "checks": checks,
                "max_error": {"decode": max_error(&checks, "decode"), "prefill": max_error(&checks, "prefill")},
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(());
        }
        println!(
            "SIMULATED: the NPU cost model's predictions beside published figures (nothing ran on an NPU)\n"
        );
        println!("Source of every figure: {}\n", params::FLM_SOURCE);
        println!("| model | phase | context | published tok/s | predicted tok/s | error |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for c in &checks {
            println!(
                "| Gemma 3 {} | {} | {}k | {:.1} | {:.1} | {:+.1}% |",
                c.published.model,
                c.published.phase,
                c.published.context / 1024,
                c.published.tokens_per_s,
                c.predicted,
                c.error * 100.0
            );
        }
        println!(
            "\nLargest error: decode {:.1}%, prefill {:.1}%.\n",
            max_error(&checks, "decode") * 100.0,
            max_error(&checks, "prefill") * 100.0
        );
        println!("Fitted (stored in params.rs / refitted now):");
        let row = |name: &str, stored: f64, now: f64, unit: &str| {
            println!("- {name}: {stored:.4e} / {now:.4e} {unit}");
        };
        row(
            "decode dispatches per layer",
            p.decode_dispatches_per_layer,
            refit.decode_dispatches_per_layer,
            "",
        );
        row(
            "weight bandwidth",
            p.weight_bytes_per_s,
            refit.weight_bytes_per_s,
            "B/s",
        );
        row(
            "KV bandwidth per KV head",
            p.kv_bytes_per_s_per_head,
            refit.kv_bytes_per_s_per_head,
            "B/s",
        );
        row(
            "prefill fixed cost per layer",
            p.prefill_layer_s,
            refit.prefill_layer_s,
            "s",
        );
        row(
            "prefill cost per token per layer",
            p.prefill_row_s,
            refit.prefill_row_s,
            "s",
        );
        row(
            "prefill rate",
            p.prefill_flops_per_s,
            refit.prefill_flops_per_s,
            "FLOP/s",
        );
        println!(
            "- cross-check: FastFlowLM's shipped GEMM overlay measured {:.2e} FLOP/s on 1024x1536x6144 (IRON)",
            p.flm_gemm_flops_per_s
        );
        println!("\nSources:");
        for s in p.sources {
            println!("- {s}");
        }
        return Ok(());
    }
    let r = rankings(p);
    if has("--json") {
        let v = serde_json::json!({
            "label": "SIMULATED: modelled placements on Ryzen AI laptops; nothing ran on an NPU or a laptop iGPU",
            "parameters": p,
            "gpus": [params::RADEON_890M, params::RADEON_860M],
            "shared_bytes_per_s": params::SHARED_BYTES_PER_S,
            "gpu_uncertainty": params::GPU_UNCERTAINTY,
            "rankings": r,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("SIMULATED: placements of Gemma 3 on Ryzen AI laptops, from the calibrated cost model.");
    println!("Nothing ran on an NPU or a laptop iGPU. Ranges: NPU terms at the calibration's largest error");
    println!(
        "for the phase, iGPU terms at +-{:.0}% (uncalibrated assumption). Decode at 1k positions, prefill of 1k-token prompts.\n",
        params::GPU_UNCERTAINTY * 100.0
    );
    println!("| model | laptop | phase | batch | rank | placement | tok/s | range | NPU ms | iGPU ms |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for t in &r {
        for (i, e) in t.ranked.iter().enumerate() {
            println!(
                "| {} | {} | {} | {} | {}{} | {} | {:.1} | {:.1}-{:.1} | {:.1} | {:.1} |",
                t.model,
                t.laptop,
                t.case.phase,
                t.case.batch,
                i + 1,
                if i == 0 && !t.clear {
                    " (within range of 2)"
                } else {
                    ""
                },
                e.placement,
                e.tokens_per_s,
                e.low,
                e.high,
                e.npu_s * 1e3,
                e.gpu_s * 1e3
            );
        }
    }
    println!("\nAssumptions and sources:");
    for s in p.sources {
        println!("- NPU: {s}");
    }
    for g in [&params::RADEON_890M, &params::RADEON_860M] {
        for s in g.sources {
            println!("- {}: {s}", g.name);
        }
    }
    println!(
        "- shared LPDDR5X: {:.0} GB/s for NPU and iGPU streaming at once (70% of LPDDR5X-7500 x 128 bit; assumption)",
        params::SHARED_BYTES_PER_S / 1e9
    );
    println!("- the NPU attention + iGPU placement pays one NPU dispatch and two hand-offs per layer; the hybrid's prefill hands the bf16 KV cache to the iGPU in one conversion pass");
    Ok(())
}

/// The earlier answer (per-op roofline, hand-set NPU figures): `bench/results/2026-11-23-npu-sim`.
fn legacy() {
    use tandem_npu::sim::{simulate, GEMMA3_1B, GEMMA3_4B, LAPTOPS, STEPS};
    println!("SIMULATED (legacy per-op model, hand-set NPU figures)\n");
    println!("| model | laptop | step | vulkan alone | npu+vulkan (serial) | split / alone |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for shape in [GEMMA3_1B, GEMMA3_4B] {
        for laptop in &LAPTOPS {
            for step in STEPS {
                let o = simulate(&shape, laptop, step);
                println!(
                    "| {} | {} | {} {} tok at {} | {:.2} ms | {:.2} ms | {:.2}x |",
                    shape.name,
                    laptop.name,
                    step.phase,
                    step.rows,
                    step.start,
                    o.vulkan_s * 1e3,
                    o.split_s * 1e3,
                    o.vulkan_s / o.split_s
                );
            }
        }
    }
}
