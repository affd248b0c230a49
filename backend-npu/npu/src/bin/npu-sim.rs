//! `npu-sim`: the simulated answer to "on a Phoenix- or Strix-class laptop, is `npu+vulkan`
//! faster than `vulkan` alone for Gemma 3 1B and 4B, at decode and at prefill?". Prints a
//! Markdown table (or JSON with `--json`). SIMULATED: no NPU or laptop GPU ran; the figures and
//! their sources are in `tandem_npu::cost` and `tandem_npu::sim`, and are printed below.

use tandem_npu::sim::{simulate, GEMMA3_1B, GEMMA3_4B, LAPTOPS, STEPS};

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let mut rows = Vec::new();
    for shape in [GEMMA3_1B, GEMMA3_4B] {
        for laptop in &LAPTOPS {
            for step in STEPS {
                rows.push((shape, laptop, step, simulate(&shape, laptop, step)));
            }
        }
    }
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(s, l, st, o)| serde_json::json!({"model": s.name, "laptop": l.name, "step": st, "outcome": o}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    println!("SIMULATED (no NPU and no laptop GPU ran; assumptions below)\n");
    println!("| model | laptop | step | vulkan alone | npu+vulkan (serial) | split / alone | GPU attention | NPU attention | hand-offs | overlap bound |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (s, l, st, o) in &rows {
        let ms = |x: f64| format!("{:.2} ms", x * 1e3);
        println!(
            "| {} | {} | {} {} tok at {} | {} | {} | {:.2}x | {} | {} | {} | {} |",
            s.name,
            l.name,
            st.phase,
            st.rows,
            st.start,
            ms(o.vulkan_s),
            ms(o.split_s),
            o.vulkan_s / o.split_s,
            ms(o.gpu_attention_s),
            ms(o.npu_s),
            ms(o.handoff_s),
            ms(o.overlap_s)
        );
    }
    println!("\n\"split / alone\" above 1.00x means npu+vulkan is faster.\n\nAssumptions:");
    for l in &LAPTOPS {
        println!("- {} NPU ({}):", l.name, l.npu.generation);
        for s in l.npu.sources {
            println!("  - {s}");
        }
        println!("- {}:", l.gpu.name);
        for s in l.gpu.sources {
            println!("  - {s}");
        }
    }
}
