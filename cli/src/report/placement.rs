//! `engine placement` as text: the rendering of the engine's [`PlacementReport`] (whose
//! serialisation is `engine placement --json`).

use tandem_engine::runtime::placement_report::{gib, PlacementReport};

/// The report as `engine placement` prints it: the origin and a line per part, the layer rule,
/// each unit with what it holds and whether that fits its budget, a line per node with where it
/// runs and why not elsewhere, the weights held twice, and what crosses between units.
pub fn placement_text(report: &PlacementReport) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "placement from {}: {}", report.origin, report.summary());
    if let Some(l) = &report.layers {
        let _ = writeln!(o, "layers: {l}");
    }
    if let Some(l) = &report.offload {
        let _ = writeln!(o, "prefill offload: {l}");
    }
    let _ = writeln!(o, "units:");
    for u in &report.units {
        match (&u.device, &u.unavailable) {
            (_, Some(r)) => {
                let _ = writeln!(o, "  {:<10} unavailable: {r}", u.name);
            }
            (d, None) => {
                let _ = writeln!(
                    o,
                    "  {:<10} {}: {} prefill / {} decode nodes, weights {} bytes, KV cache {} bytes",
                    u.name,
                    d.as_deref().unwrap_or("?"),
                    u.nodes.0,
                    u.nodes.1,
                    u.weight_bytes,
                    u.kv_cache_bytes
                );
                if u.nodes != (0, 0) {
                    let budget = u.budget_bytes.map_or_else(
                        || "no stated budget".to_string(),
                        |b| {
                            let verdict = if u.over_budget() { "does not fit" } else { "fits" };
                            format!("{verdict} its budget of {}", gib(b))
                        },
                    );
                    let _ = writeln!(
                        o,
                        "  {:<10} memory: needs {} (weights {}, KV cache {}, activations about {}); {budget}",
                        "",
                        gib(u.need_bytes()),
                        gib(u.weight_bytes),
                        gib(u.kv_cache_bytes),
                        gib(u.activation_bytes),
                    );
                    if u.host_weight_bytes > 0 {
                        let _ = writeln!(
                            o,
                            "  {:<10} reads {} of weights from host memory in prefill (the offload), outside its budget",
                            "",
                            gib(u.host_weight_bytes),
                        );
                    }
                    if !u.shares_device_with.is_empty() {
                        let _ = writeln!(
                            o,
                            "  {:<10} shares its device and its budget with {}: {} together",
                            "",
                            u.shares_device_with.join(", "),
                            gib(u.device_need_bytes),
                        );
                    }
                }
            }
        }
    }
    let _ = writeln!(
        o,
        "nodes (index, op, part, unit; prefill/decode where they differ):"
    );
    for n in &report.nodes {
        let unit = if n.prefill.unit == n.decode.unit {
            n.decode.unit.clone()
        } else {
            format!("{}/{}", n.prefill.unit, n.decode.unit)
        };
        let mut why: Vec<&str> = Vec::new();
        for w in [&n.prefill.why, &n.decode.why] {
            if !w.is_empty() && !why.contains(&w.as_str()) {
                why.push(w);
            }
        }
        let why = if why.is_empty() {
            String::new()
        } else {
            format!("  ({})", why.join("; "))
        };
        let _ = writeln!(
            o,
            "  {:>4}  {:<20} {:<9} {unit}{why}",
            n.index,
            n.op,
            n.part.key()
        );
    }
    if report.shared_weights.is_empty() {
        let _ = writeln!(o, "weights on two units: none");
    }
    for w in &report.shared_weights {
        let _ = writeln!(
            o,
            "weight on two units: {} ({} bytes each, on {})",
            w.name,
            w.bytes,
            w.units.join(" and ")
        );
    }
    let _ = writeln!(
        o,
        "programs per step: {} prefill, {} decode",
        report.programs_per_step.0, report.programs_per_step.1
    );
    let _ = writeln!(
        o,
        "copied between units through the host: {} bytes per decode token, {:.1} bytes per prompt token (chunk {})",
        report.decode_bytes_per_token, report.prefill_bytes_per_token, report.prefill_chunk
    );
    if let (Some(peak), Some(process)) = (report.host_peak_bytes(), report.process_bytes) {
        let _ = writeln!(
            o,
            "host memory: peak about {} (this process before the weights {}, measured; the CPU backend's share as above)",
            gib(peak),
            gib(process)
        );
    }
    if report.kv_handoff_layers == 0 {
        let _ = writeln!(o, "KV-cache hand-off: none (attention runs alike in both phases)");
    } else {
        let _ = writeln!(
            o,
            "KV-cache hand-off: {} bytes per prompt token ({} layers; a sliding layer stops at its ring's capacity), once per sequence",
            report.kv_handoff_bytes_per_token, report.kv_handoff_layers
        );
    }
    if let Some(v) = &report.vision {
        let _ = writeln!(
            o,
            "vision tower: {} ({} layers, width {}, {} heads; {} patches an image, {} tokens), weights {}, on {}",
            v.source,
            v.layers,
            v.hidden,
            v.heads,
            v.patches,
            v.tokens_per_image,
            gib(v.weight_bytes),
            v.unit.as_deref().unwrap_or("no unit (loading fails)")
        );
        if !v.measured.is_empty() {
            let each: Vec<String> = v
                .measured
                .iter()
                .map(|(n, ms)| format!("{n} {ms:.1} ms"))
                .collect();
            let _ = writeln!(
                o,
                "  ordered by auto's measurement (one encoder layer, a blank image): {}",
                each.join(", ")
            );
        }
        for c in &v.candidates {
            let _ = writeln!(o, "  {:<10} {}", c.name, c.verdict);
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use tandem_engine::model::Part;
    use tandem_engine::runtime::placement_report::{
        NodeReport, SharedWeight, UnitReport, VisionCandidate, VisionReport, Where,
    };

    use super::*;

    fn unit(name: &str, nodes: (usize, usize), budget: Option<u64>) -> UnitReport {
        UnitReport {
            name: name.into(),
            device: Some(format!("{name} device")),
            unavailable: None,
            nodes,
            weight_bytes: 3 << 20,
            kv_cache_bytes: 1 << 20,
            activation_bytes: 64 << 10,
            budget_bytes: budget,
            shares_device_with: Vec::new(),
            device_need_bytes: (3 << 20) + (1 << 20) + (64 << 10),
            budget_of: None,
            host_weight_bytes: 0,
            host: false,
        }
    }

    fn at(unit: &str, why: &str) -> Where {
        Where {
            unit: unit.into(),
            why: why.into(),
        }
    }

    /// Every branch of the text: a layer rule, an unavailable unit, a unit over its budget, one
    /// without a stated budget, one running nothing, a node whose phases differ, reasons told
    /// once, a weight on two units, and a KV-cache hand-off.
    #[test]
    fn every_part_of_the_report_is_written() {
        let report = PlacementReport {
            origin: "--backend gpu+cpu".into(),
            units: vec![
                UnitReport {
                    device: None,
                    unavailable: Some("no 'npu' backend plugin found".into()),
                    ..unit("npu", (0, 0), None)
                },
                unit("gpu", (2, 1), Some(4 << 20)),
                unit("cpu", (1, 2), None),
                unit("cpu#2", (0, 0), Some(1 << 30)),
            ],
            nodes: vec![
                NodeReport {
                    index: 0,
                    op: "embed(f32)".into(),
                    part: Part::Other,
                    prefill: at("cpu", "npu unavailable: gone"),
                    decode: at("cpu", "npu unavailable: gone"),
                },
                NodeReport {
                    index: 1,
                    op: "attention(kv f32)".into(),
                    part: Part::Attention,
                    prefill: at("gpu", ""),
                    decode: at("cpu", "gpu does not run it: too long"),
                },
                NodeReport {
                    index: 12,
                    op: "matmul(q4_k)".into(),
                    part: Part::Ffn,
                    prefill: at("gpu", ""),
                    decode: at("gpu", ""),
                },
            ],
            shared_weights: vec![SharedWeight {
                name: "token_embd.weight".into(),
                bytes: 1024,
                units: vec!["gpu".into(), "cpu".into()],
            }],
            layers: Some("gpu: layers 0-2, embedding, head; cpu: layers 3-5".into()),
            programs_per_step: (3, 2),
            decode_bytes_per_token: 4096,
            prefill_chunk: 64,
            prefill_bytes_per_token: 1234.56,
            kv_handoff_layers: 2,
            kv_handoff_bytes_per_token: 512,
            process_bytes: None,
            offload: Some("gpu runs 12 products ...".into()),
            vision: None,
        };
        let want = "\
placement from --backend gpu+cpu: prefill: attention on gpu, ffn on gpu, default on cpu; decode: attention on cpu, ffn on gpu, default on cpu
layers: gpu: layers 0-2, embedding, head; cpu: layers 3-5
prefill offload: gpu runs 12 products ...
units:
  npu        unavailable: no 'npu' backend plugin found
  gpu        gpu device: 2 prefill / 1 decode nodes, weights 3145728 bytes, KV cache 1048576 bytes
             memory: needs 4.1 MiB (weights 3.0 MiB, KV cache 1.0 MiB, activations about 64.0 KiB); does not fit its budget of 4.0 MiB
  cpu        cpu device: 1 prefill / 2 decode nodes, weights 3145728 bytes, KV cache 1048576 bytes
             memory: needs 4.1 MiB (weights 3.0 MiB, KV cache 1.0 MiB, activations about 64.0 KiB); no stated budget
  cpu#2      cpu#2 device: 0 prefill / 0 decode nodes, weights 3145728 bytes, KV cache 1048576 bytes
nodes (index, op, part, unit; prefill/decode where they differ):
     0  embed(f32)           default   cpu  (npu unavailable: gone)
     1  attention(kv f32)    attention gpu/cpu  (gpu does not run it: too long)
    12  matmul(q4_k)         ffn       gpu
weight on two units: token_embd.weight (1024 bytes each, on gpu and cpu)
programs per step: 3 prefill, 2 decode
copied between units through the host: 4096 bytes per decode token, 1234.6 bytes per prompt token (chunk 64)
KV-cache hand-off: 512 bytes per prompt token (2 layers; a sliding layer stops at its ring's capacity), once per sequence
";
        assert_eq!(placement_text(&report), want);

        let one = PlacementReport {
            units: vec![unit("cpu", (3, 3), Some(1 << 30))],
            nodes: vec![],
            shared_weights: vec![],
            layers: None,
            kv_handoff_layers: 0,
            kv_handoff_bytes_per_token: 0,
            process_bytes: None,
            offload: None,
            vision: Some(VisionReport {
                source: "mm.gguf (mmproj)".into(),
                layers: 27,
                hidden: 1152,
                heads: 16,
                patches: 4096,
                tokens_per_image: 256,
                unit: Some("vulkan".into()),
                weight_bytes: 3 << 29,
                measured: Vec::new(),
                candidates: vec![
                    VisionCandidate {
                        name: "npu".into(),
                        verdict: "refuses: layer_norm(f32): no kernel".into(),
                    },
                    VisionCandidate {
                        name: "vulkan".into(),
                        verdict: "runs the tower".into(),
                    },
                ],
            }),
            ..report
        };
        let text = placement_text(&one);
        assert!(text.contains("\nweights on two units: none\n"), "{text}");
        assert!(text.contains("fits its budget of 1.00 GiB"), "{text}");
        assert!(
            text.ends_with(
                "KV-cache hand-off: none (attention runs alike in both phases)\n\
                 vision tower: mm.gguf (mmproj) (27 layers, width 1152, 16 heads; 4096 patches an image, 256 tokens), weights 1.50 GiB, on vulkan\n\
                 \x20 npu        refuses: layer_norm(f32): no kernel\n\
                 \x20 vulkan     runs the tower\n"
            ),
            "{text}"
        );
        assert!(!text.contains("layers:"), "{text}");
        assert!(!text.contains("offload"), "{text}");
    }
}
