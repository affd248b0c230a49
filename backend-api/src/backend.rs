//! The `ComputeBackend` trait and what it reports about itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::BackendError;
use crate::graph::{Graph, Op, StepArgs};
use crate::tensor::{BufferId, TensorDesc, Usage};

/// A compiled program, issued by the backend that compiled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProgramId(pub u64);

/// A submitted execution, to [`ComputeBackend::wait`] on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ticket(pub u64);

/// Device time of one node of a program's last finished execution (see
/// [`ComputeBackend::profile`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTime {
    /// The node's index in [`Graph::nodes`].
    pub node: usize,
    /// The node's short name ([`Op::name`]: `matmul(q4_k)`).
    pub op: String,
    /// Seconds the device spent on it.
    pub seconds: f64,
}

/// The device memory a backend holds (see [`ComputeBackend::memory`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// Bytes allocated now (buffers, program arenas, staging).
    pub in_use_bytes: u64,
    /// The most allocated at any time since the backend was created.
    pub peak_bytes: u64,
}

/// The kind of device a backend drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// The host CPU.
    Cpu,
    /// A GPU sharing memory with the CPU.
    IntegratedGpu,
    /// A GPU with its own memory.
    DiscreteGpu,
    /// A software rasteriser exposed as a GPU (lavapipe, llvmpipe, SwiftShader).
    SoftwareGpu,
    /// A neural processing unit.
    Npu,
}

/// What a backend says about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// The backend's name (`cpu`, `vulkan`, `npu`, `wgpu`).
    pub name: String,
    /// The device it runs on, as the user would recognise it.
    pub device: String,
    /// The kind of device.
    pub kind: DeviceKind,
    /// Memory the device offers for buffers, when known.
    pub memory_bytes: Option<u64>,
    /// Free-form facts worth showing (`threads=2`, `fp16`, `cooperative_matrix`).
    pub features: Vec<String>,
}

/// The answer to [`ComputeBackend::supports`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "support", rename_all = "snake_case")]
pub enum Support {
    /// The backend runs this op as described.
    Yes,
    /// It does not, and why (for the placement report).
    No {
        /// Why not, naming the dtype, shape or feature.
        reason: String,
    },
}

impl Support {
    /// Whether the answer is yes.
    pub fn is_yes(&self) -> bool {
        matches!(self, Support::Yes)
    }
}

/// Options for creating a backend (from the TOML config's `[backend.NAME]` table or the
/// command line), as key/value strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendOptions {
    /// The entries.
    pub entries: BTreeMap<String, String>,
}

impl BackendOptions {
    /// Adds or replaces an entry.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.entries.insert(key.into(), value.into());
        self
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// The value of `key` parsed as `T`; an error names the key and the value when it does not
    /// parse.
    pub fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, BackendError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                BackendError::invalid(format!(
                    "backend option '{key}': cannot parse '{v}' as {}",
                    std::any::type_name::<T>()
                ))
            }),
        }
    }
}

/// A compute backend: buffers, and programs compiled once from a [`Graph`] and executed many
/// times with small per-step [`StepArgs`].
///
/// Ordering contract: calls are processed in order. `execute` may return before the work
/// finishes; `read`, `write` and `free` of a buffer wait for submitted work that uses it, and
/// `wait` returns once the ticket's execution (and everything before it) has finished. No
/// method panics on bad input: it returns [`BackendError::InvalidArgument`].
pub trait ComputeBackend: Send {
    /// Name, device and kind.
    fn info(&self) -> BackendInfo;

    /// Whether this backend runs `op` as documented (weights in the op's dtype included); the
    /// placement asks before assigning a node. Buffers in the op may be [`BufferId::UNBOUND`].
    fn supports(&self, op: &Op) -> Support;

    /// Allocates a buffer for a tensor of `desc`, for `usage`; its contents start as zeros.
    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError>;

    /// Copies `data` into `buffer` at byte `offset`.
    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError>;

    /// Copies `out.len()` bytes from `buffer` at byte `offset` into `out`.
    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError>;

    /// Releases a buffer. Programs that use it must be released first.
    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError>;

    /// Validates and compiles a graph (pipelines, descriptor sets, command buffers, arena) once.
    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError>;

    /// Runs a compiled program on one step's arguments.
    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError>;

    /// Blocks until the execution behind `ticket` has finished.
    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError>;

    /// Releases a compiled program.
    fn release(&mut self, program: ProgramId) -> Result<(), BackendError>;

    /// Per-node device time of `program`'s last finished execution, in node order, for
    /// backends that measure it (GPU timestamp queries); empty when the backend does not, or
    /// before the program has finished an execution.
    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        let _ = program;
        Ok(Vec::new())
    }

    /// Device memory this backend holds, for backends with memory of their own (GPUs, NPUs);
    /// `None` where the host's RSS already counts it (the CPU).
    fn memory(&mut self) -> Result<Option<MemoryUse>, BackendError> {
        Ok(None)
    }

    /// Measures now the bandwidth of a large device-to-device copy on this backend's memory,
    /// in bytes per second counting bytes read and bytes written: the roofline that decode
    /// speed is compared with. `None` where the host's memory is the backend's (the caller
    /// measures a host copy instead).
    fn copy_bandwidth(&mut self) -> Result<Option<f64>, BackendError> {
        Ok(None)
    }
}

/// A backend that a plugin library can create: what `export_backend!` needs.
pub trait BackendPlugin: ComputeBackend + Sized + 'static {
    /// The backend's name (`cpu`, `vulkan`, ...), as users write it in `--backend`.
    const NAME: &'static str;

    /// Creates the backend, or says why it cannot run here
    /// ([`BackendError::Unavailable`] with a reason naming what is missing).
    fn create(options: &BackendOptions) -> Result<Self, BackendError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_name_the_key() {
        let mut o = BackendOptions::default();
        o.set("threads", "4").set("device", "x");
        assert_eq!(o.parse::<usize>("threads").unwrap(), Some(4));
        assert_eq!(o.parse::<usize>("missing").unwrap(), None);
        let err = o.parse::<usize>("device").unwrap_err().to_string();
        assert!(err.contains("'device'") && err.contains("'x'"), "{err}");
    }
}
