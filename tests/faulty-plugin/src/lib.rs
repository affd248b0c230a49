//! A backend plugin that panics on purpose, so tests can show that no panic crosses the plugin
//! boundary. Option `panic_in` names the call that panics (`create`, `compile`, `execute`,
//! `alloc`, `estimate_decode`); every other call succeeds trivially, and `estimate_decode`
//! echoes its query (for the ABI's round trip). Its file name does not start with
//! `tandem_backend_`, so plugin discovery never picks it up.

use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, CostAnswer,
    CostQuery, DeviceKind, Graph, Op, PlacementEstimate, ProgramId, StepArgs, Support, TensorDesc, Ticket,
    Usage,
};

/// The faulty backend.
pub struct FaultyBackend {
    panic_in: String,
}

impl FaultyBackend {
    fn maybe_panic(&self, call: &str) {
        if self.panic_in == call {
            panic!("deliberate panic in {call}");
        }
    }
}

impl BackendPlugin for FaultyBackend {
    const NAME: &'static str = "faulty";

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        let panic_in = options.get("panic_in").unwrap_or("").to_string();
        if panic_in == "create" {
            panic!("deliberate panic in create");
        }
        Ok(FaultyBackend { panic_in })
    }
}

impl ComputeBackend for FaultyBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "faulty".into(),
            device: "nothing".into(),
            kind: DeviceKind::Cpu,
            memory_bytes: None,
            features: vec![],
        }
    }
    fn supports(&self, _op: &Op) -> Support {
        Support::Yes
    }
    fn alloc(&mut self, _desc: &TensorDesc, _usage: Usage) -> Result<BufferId, BackendError> {
        self.maybe_panic("alloc");
        Ok(BufferId(1))
    }
    fn write(&mut self, _: BufferId, _: u64, _: &[u8]) -> Result<(), BackendError> {
        Ok(())
    }
    fn read(&mut self, _: BufferId, _: u64, _: &mut [u8]) -> Result<(), BackendError> {
        Ok(())
    }
    fn free(&mut self, _: BufferId) -> Result<(), BackendError> {
        Ok(())
    }
    fn compile(&mut self, _graph: &Graph) -> Result<ProgramId, BackendError> {
        self.maybe_panic("compile");
        Ok(ProgramId(1))
    }
    fn execute(&mut self, _: ProgramId, _: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        self.maybe_panic("execute");
        Ok(Ticket(1))
    }
    fn wait(&mut self, _: Ticket) -> Result<(), BackendError> {
        Ok(())
    }
    fn release(&mut self, _: ProgramId) -> Result<(), BackendError> {
        Ok(())
    }
    /// No peers: no answer. Otherwise each peer alone and beside it, the query's figures in the
    /// estimates (context as tokens per second, layers as the peer's seconds), so that a test
    /// sees every field cross both ways.
    fn estimate_decode(&self, query: &CostQuery) -> Option<CostAnswer> {
        self.maybe_panic("estimate_decode");
        if query.peers.is_empty() {
            return None;
        }
        let estimates = query
            .peers
            .iter()
            .flat_map(|p| {
                [false, true].map(|here| PlacementEstimate {
                    peer: p.name.clone(),
                    attention_here: here,
                    tokens_per_s: query.context as f64,
                    low: query.model.heads as f64,
                    high: query.model.vocab as f64,
                    own_s: if here { query.model.head_dim as f64 } else { 0.0 },
                    peer_s: query.model.layers as f64,
                })
            })
            .collect();
        Some(CostAnswer {
            estimates,
            own_uncertainty: 0.5,
            peer_uncertainty: 0.25,
            simulated: true,
            basis: query
                .peers
                .iter()
                .map(|p| format!("{} {:?} {}", p.name, p.kind, p.device))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

tandem_backend_api::export_backend!(FaultyBackend);
