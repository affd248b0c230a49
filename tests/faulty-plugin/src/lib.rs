//! A backend plugin that panics on purpose, so tests can show that no panic crosses the plugin
//! boundary. Option `panic_in` names the call that panics (`create`, `compile`, `execute`,
//! `alloc`); every other call succeeds trivially. Its file name does not start with
//! `tandem_backend_`, so plugin discovery never picks it up.

use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, DeviceKind, Graph,
    Op, ProgramId, StepArgs, Support, TensorDesc, Ticket, Usage,
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
}

tandem_backend_api::export_backend!(FaultyBackend);
