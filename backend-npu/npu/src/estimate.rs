//! The NPU backend's answer to `ComputeBackend::estimate_decode`: the calibrated cost model
//! (`tandem-npu-model`) asked about one sequence's decode on each laptop iGPU it knows, alone
//! and with attention on this NPU. SIMULATED: nothing here ran on an NPU or a laptop iGPU.
//!
//! The model has figures for an XDNA2 NPU (`generation=npu4`, `npu5`, `npu6` among the
//! backend's features, which the device executor reports; the emulator reports none) beside a
//! Radeon 890M or 860M (known by the peer's device name). Anything else: no answer.

use tandem_backend_api::{BackendInfo, CostAnswer, CostQuery, DeviceKind, ModelShape, PlacementEstimate};
use tandem_npu_model::calibration::{self as model, Estimate};
use tandem_npu_model::gpu::Shape;
use tandem_npu_model::params::GPU_UNCERTAINTY;

/// The NPU generation a backend reports (`generation=npu4` among its features).
fn generation(info: &BackendInfo) -> Option<&str> {
    info.features.iter().find_map(|f| f.strip_prefix("generation="))
}

/// The cost model's description of `m`.
fn shape_of(m: &ModelShape) -> Shape {
    Shape {
        name: "this model",
        hidden: m.hidden,
        intermediate: m.intermediate,
        layers: m.layers,
        heads: m.heads,
        kv_heads: m.kv_heads,
        head_dim: m.head_dim,
        window: m.window,
        vocab: m.vocab,
    }
}

fn placement(peer: &str, attention_here: bool, e: &Estimate) -> PlacementEstimate {
    PlacementEstimate {
        peer: peer.to_string(),
        attention_here,
        tokens_per_s: e.tokens_per_s,
        low: e.low,
        high: e.high,
        own_s: e.npu_s,
        peer_s: e.gpu_s,
    }
}

/// The answer of an NPU backend whose info is `info`: for every integrated GPU among the peers
/// that the model knows, its decode alone and with attention on the NPU, all on the laptop of
/// the first such GPU (a machine has one iGPU; several backends may drive it). `None` where the
/// model has no figures for this NPU's generation or for any iGPU present.
pub fn estimate_decode(info: &BackendInfo, query: &CostQuery) -> Option<CostAnswer> {
    if !generation(info).is_some_and(model::npu_has_figures) {
        return None;
    }
    let known: Vec<(&str, &'static model::Laptop)> = query
        .peers
        .iter()
        .filter(|p| p.kind == DeviceKind::IntegratedGpu)
        .filter_map(|p| Some((p.name.as_str(), model::laptop_for_gpu(&p.device)?)))
        .collect();
    let &(_, laptop) = known.first()?;
    let m = model::auto_decode(&shape_of(&query.model), laptop, query.context);
    let estimates = known
        .iter()
        .flat_map(|&(peer, _)| {
            [
                placement(peer, false, &m.gpu_only),
                placement(peer, true, &m.npu_attention),
            ]
        })
        .collect();
    Some(CostAnswer {
        estimates,
        own_uncertainty: m.npu_error,
        peer_uncertainty: GPU_UNCERTAINTY,
        simulated: true,
        basis: format!(
            "calibrated against FastFlowLM's published XDNA2 figures; {}; NPU +-{:.0}%, iGPU +-{:.0}%",
            laptop.name,
            m.npu_error * 100.0,
            GPU_UNCERTAINTY * 100.0
        ),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use tandem_backend_api::PeerUnit;
    use tandem_npu_model::gpu::GEMMA3_1B;

    use super::*;

    pub(crate) fn npu_info(features: &[&str]) -> BackendInfo {
        BackendInfo {
            name: "npu".into(),
            device: "AMD NPU npu4 (RyzenAI-npu4) at /dev/accel/accel0".into(),
            kind: DeviceKind::Npu,
            memory_bytes: None,
            features: features.iter().map(|f| f.to_string()).collect(),
            physical_device: None,
            decode_rows: None,
        }
    }

    pub(crate) fn query(gpu: &str) -> CostQuery {
        let s = GEMMA3_1B;
        CostQuery {
            model: ModelShape {
                hidden: s.hidden,
                intermediate: s.intermediate,
                layers: s.layers,
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                window: s.window,
                vocab: s.vocab,
            },
            context: 80,
            peers: vec![
                PeerUnit {
                    name: "vulkan".into(),
                    kind: DeviceKind::IntegratedGpu,
                    device: gpu.into(),
                },
                PeerUnit {
                    name: "cpu".into(),
                    kind: DeviceKind::Cpu,
                    device: "host".into(),
                },
            ],
        }
    }

    #[test]
    fn an_xdna2_npu_beside_a_known_igpu_answers_with_the_model() {
        let a = estimate_decode(
            &npu_info(&["generation=npu4"]),
            &query("AMD Radeon 890M Graphics (RADV GFX1150)"),
        )
        .unwrap();
        // The iGPU alone and with attention here; nothing for the CPU.
        assert_eq!(a.estimates.len(), 2);
        let m = model::auto_decode(&GEMMA3_1B, &model::LAPTOPS[0], 80);
        let alone = a.estimate("vulkan", false).unwrap();
        let beside = a.estimate("vulkan", true).unwrap();
        assert_eq!(alone.tokens_per_s, m.gpu_only.tokens_per_s);
        assert_eq!(
            (beside.own_s, beside.peer_s),
            (m.npu_attention.npu_s, m.npu_attention.gpu_s)
        );
        assert_eq!(a.own_uncertainty, m.npu_error);
        assert_eq!(a.peer_uncertainty, GPU_UNCERTAINTY);
        assert!(a.simulated);
        assert!(a.basis.contains("Strix"), "{}", a.basis);
        // The rule the engine applies: attention here is behind the iGPU everywhere.
        assert!(a.slower_everywhere(beside, alone));
        assert!(a.estimate("cpu", false).is_none());
    }

    #[test]
    fn no_figures_no_answer() {
        let gen4 = npu_info(&["generation=npu4"]);
        // A GPU the model does not know.
        assert_eq!(estimate_decode(&gen4, &query("NVIDIA H100 80GB HBM3")), None);
        // An XDNA (npu1) NPU.
        let npu1 = npu_info(&["generation=npu1"]);
        assert_eq!(estimate_decode(&npu1, &query("AMD Radeon 890M")), None);
        // The emulator: simulated timing, no device generation.
        let emu = npu_info(&["emulated", "simulated_timing=npu4"]);
        assert_eq!(estimate_decode(&emu, &query("AMD Radeon 890M")), None);
        // A known name on a discrete GPU's kind is not the laptop's iGPU.
        let mut q = query("AMD Radeon 890M");
        q.peers[0].kind = DeviceKind::DiscreteGpu;
        assert_eq!(estimate_decode(&gen4, &q), None);
    }
}
