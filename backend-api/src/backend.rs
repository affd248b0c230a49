//! The `ComputeBackend` trait and what it reports about itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::boundary::{SharedTimeline, TimelineId};
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
    /// The physical device, the same string for every backend on it (Vulkan's `deviceUUID` in
    /// hex, which wgpu's Vulkan adapters report too), so that what binds one device (a memory
    /// budget) can bind every unit on it; `None` for the host CPU and where unknown. Absent from
    /// the JSON of plugins that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_device: Option<String>,
    /// The most rows of one sequence (one slot) a step computes as it computes a single row:
    /// the decode kernels, each row's result bit for bit what it would be alone; a longer run
    /// of one slot's rows (a prompt chunk) may take other kernels, with other rounding.
    /// Speculative decoding keeps its verification steps within it, so that greedy output is
    /// plain decoding's token for token. `None` where unknown. Absent from the JSON of
    /// plugins that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_rows: Option<usize>,
}

/// A model's shape as a cost model sees it: the widths and counts that set a decode step's
/// bytes and work (Gemma 3: five local layers of `window` positions in every six).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Hidden size.
    pub hidden: usize,
    /// FFN width.
    pub intermediate: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Sliding window of the local layers.
    pub window: usize,
    /// Vocabulary.
    pub vocab: usize,
}

/// Another unit of the machine, which a placement may pair with the backend asked (see
/// [`ComputeBackend::estimate_decode`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerUnit {
    /// The backend name the caller places by (`vulkan`, `cpu`).
    pub name: String,
    /// Its kind of device.
    pub kind: DeviceKind,
    /// Its device, as its [`BackendInfo::device`] says.
    pub device: String,
}

/// What [`ComputeBackend::estimate_decode`] is asked: one sequence's decode of `model` at
/// `context` positions, on each of `peers` alone and with this backend beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostQuery {
    /// The model.
    pub model: ModelShape,
    /// Positions each decoded token sees.
    pub context: usize,
    /// The machine's other units.
    pub peers: Vec<PeerUnit>,
}

/// One placement's estimate in a [`CostAnswer`]: a step's time split into the share of the
/// backend asked and the share of the peer, each with the answer's uncertainty of its side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementEstimate {
    /// The peer ([`PeerUnit::name`]).
    pub peer: String,
    /// `false`: the whole model on the peer; `true`: attention on the backend asked and the
    /// rest on the peer (the engine's `npu+vulkan`).
    pub attention_here: bool,
    /// Decoded tokens per second, central.
    pub tokens_per_s: f64,
    /// Tokens per second with every term at its slow end.
    pub low: f64,
    /// Tokens per second with every term at its fast end.
    pub high: f64,
    /// Seconds per step on (or caused by) the backend asked.
    pub own_s: f64,
    /// Seconds per step on the peer (and the hand-offs between the two).
    pub peer_s: f64,
}

/// A backend's estimates of the placements it has figures for ([`ComputeBackend::estimate_decode`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostAnswer {
    /// One per placement estimated; peers the backend has no figures for are absent.
    pub estimates: Vec<PlacementEstimate>,
    /// Relative uncertainty of every [`PlacementEstimate::own_s`] (`0.11`: +-11%).
    pub own_uncertainty: f64,
    /// Relative uncertainty of every [`PlacementEstimate::peer_s`].
    pub peer_uncertainty: f64,
    /// Whether the figures come from a model rather than a measurement on this machine: the
    /// caller then says `SIMULATED` wherever it shows them.
    pub simulated: bool,
    /// What the figures rest on, for the user (`calibrated against ...; the laptop; NPU +-11%,
    /// iGPU +-25%`), without the `SIMULATED` label.
    pub basis: String,
}

impl CostAnswer {
    /// The estimate for `peer`, alone (`attention_here` false) or beside the backend asked.
    pub fn estimate(&self, peer: &str, attention_here: bool) -> Option<&PlacementEstimate> {
        self.estimates
            .iter()
            .find(|e| e.peer == peer && e.attention_here == attention_here)
    }

    /// Whether `a` is slower than `b` at every end of the uncertainty: the backend's shares
    /// scaled by `1 +- own_uncertainty` and the peers' by `1 +- peer_uncertainty`, the same
    /// factor for both placements (they run on the same units, so a figure that is off is off
    /// for both).
    pub fn slower_everywhere(&self, a: &PlacementEstimate, b: &PlacementEstimate) -> bool {
        let (o, p) = (self.own_uncertainty, self.peer_uncertainty);
        [1.0 - o, 1.0 + o]
            .into_iter()
            .flat_map(|n| [1.0 - p, 1.0 + p].map(|g| (n, g)))
            .all(|(n, g)| a.own_s * n + a.peer_s * g > b.own_s * n + b.peer_s * g)
    }
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

    /// The value of `key` as a size in bytes ([`parse_bytes`]); an error names the key.
    pub fn bytes(&self, key: &str) -> Result<Option<u64>, BackendError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => parse_bytes(v)
                .map(Some)
                .map_err(|e| BackendError::invalid(format!("backend option '{key}': {e}"))),
        }
    }

    /// The memory a backend may use on a device of `device_bytes`: [`MEMORY_LIMIT`] when set
    /// (an error when it is larger than the device), else the device's.
    pub fn memory_budget(&self, device_bytes: u64) -> Result<u64, BackendError> {
        match self.bytes(MEMORY_LIMIT)? {
            None => Ok(device_bytes),
            Some(limit) if limit > device_bytes => Err(BackendError::invalid(format!(
                "backend option '{MEMORY_LIMIT}': {limit} bytes ({:.2} GiB) is more than the device's {device_bytes} bytes ({:.2} GiB)",
                limit as f64 / GIB,
                device_bytes as f64 / GIB
            ))),
            Some(limit) => Ok(limit),
        }
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The option every device backend honours: the most bytes of device memory it may allocate
/// (`[backend.NAME] memory_limit = "8GiB"`). [`BackendInfo::memory_bytes`] reports the smaller
/// of it and the device's memory, and `alloc` refuses what would pass it.
pub const MEMORY_LIMIT: &str = "memory_limit";

/// The feature ([`BackendInfo::features`]) of a device backend that places
/// [`crate::Usage::HostWeight`] buffers in host memory outside its budget (the Vulkan backend
/// copies each into a buffer of its own before the product that reads it): the engine runs the products of layers held elsewhere on it for prefill steps only
/// where a unit lists it.
pub const HOST_WEIGHTS_FEATURE: &str = "host_weights";

/// Parses a size in bytes: a whole number with an optional unit, `B`, `KiB`, `MiB`, `GiB`,
/// `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000), case-insensitive, spaces
/// allowed before the unit (`8GiB`, `512 MiB`, `1.5GiB`, `1000000`). The error says what is wrong.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}': expected a size such as 8GiB or 512MiB"))?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{text}': a size must be at least 1 byte"));
    }
    Ok(bytes as u64)
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

    /// Estimates one sequence's decode on the placements this backend has a cost model for:
    /// each of `query.peers` it has figures for alone, and with attention here and the rest on
    /// it. `None` (the default) where the backend has no such model, or no figures for its own
    /// device or for any peer. The caller uses it to choose which placements are worth
    /// measuring; it never replaces a measurement.
    fn estimate_decode(&self, query: &CostQuery) -> Option<CostAnswer> {
        let _ = query;
        None
    }

    /// Makes the host memory `ptr..ptr + len` a buffer for a tensor of `desc` (device-side
    /// boundaries, see [`crate::boundary`]): programs read and write it in place, and so do
    /// other backends that imported the same region. Backends that cannot return
    /// [`BackendError::Unsupported`] (the default), and the caller copies through the host.
    ///
    /// # Safety
    /// `ptr` must be aligned to [`crate::HOST_IMPORT_ALIGN`], `len` a multiple of it and at
    /// least `desc`'s size, and the region valid for reads and writes, not freed and not
    /// accessed through Rust references, until this backend has freed the returned buffer
    /// ([`ComputeBackend::free`]).
    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        let _ = (ptr, len, desc);
        Err(BackendError::unsupported(
            "import_host",
            format!("{} cannot use host memory it did not allocate", self.info().name),
        ))
    }

    /// Exports the timeline that this backend's tickets count on, for another backend to wait
    /// on with [`ComputeBackend::execute_after`]; `None` (the default) where the backend has
    /// none to share.
    fn export_timeline(&mut self) -> Result<Option<SharedTimeline>, BackendError> {
        Ok(None)
    }

    /// Imports another backend's exported timeline; `None` (the default) where this backend
    /// cannot wait on it (another driver or device, a handle kind it does not know).
    fn import_timeline(&mut self, timeline: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        let _ = timeline;
        Ok(None)
    }

    /// [`ComputeBackend::execute`], with the device starting the work only once every imported
    /// timeline of `waits` has reached its ticket: the host does not wait. At most
    /// [`crate::boundary::MAX_WAITS`] waits. The default runs
    /// `execute` when there is nothing to wait for and refuses otherwise.
    fn execute_after(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(TimelineId, Ticket)],
    ) -> Result<Ticket, BackendError> {
        if waits.is_empty() {
            return self.execute(program, args);
        }
        Err(BackendError::unsupported(
            "execute_after",
            format!("{} cannot wait on another backend's timeline", self.info().name),
        ))
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

#[cfg(test)]
mod cost_tests {
    use super::*;

    fn e(peer: &str, attention_here: bool, own_s: f64, peer_s: f64) -> PlacementEstimate {
        let t = own_s + peer_s;
        PlacementEstimate {
            peer: peer.into(),
            attention_here,
            tokens_per_s: 1.0 / t,
            low: 1.0 / (t * 1.1),
            high: 1.0 / (t * 0.9),
            own_s,
            peer_s,
        }
    }

    fn answer() -> CostAnswer {
        CostAnswer {
            estimates: vec![e("vulkan", false, 0.0, 0.010), e("vulkan", true, 0.004, 0.009)],
            own_uncertainty: 0.1,
            peer_uncertainty: 0.25,
            simulated: true,
            basis: "a model".into(),
        }
    }

    #[test]
    fn backend_info_without_a_physical_device_still_parses() {
        // A plugin built before `physical_device` existed.
        let old = r#"{"name":"vulkan","device":"GPU","kind":"discrete_gpu","memory_bytes":1024,"features":["fp16"]}"#;
        let info: BackendInfo = serde_json::from_str(old).unwrap();
        assert_eq!(info.physical_device, None);
        let mut info = info;
        info.physical_device = Some("00ff".into());
        let back: BackendInfo = serde_json::from_str(&serde_json::to_string(&info).unwrap()).unwrap();
        assert_eq!(back, info);
    }

    #[test]
    fn a_query_and_an_answer_cross_as_json() {
        let q = CostQuery {
            model: ModelShape {
                hidden: 1152,
                intermediate: 6912,
                layers: 26,
                heads: 4,
                kv_heads: 1,
                head_dim: 256,
                window: 512,
                vocab: 262_144,
            },
            context: 80,
            peers: vec![PeerUnit {
                name: "vulkan".into(),
                kind: DeviceKind::IntegratedGpu,
                device: "AMD Radeon 890M".into(),
            }],
        };
        let text = serde_json::to_string(&q).unwrap();
        assert!(text.contains("\"kind\":\"integrated_gpu\""), "{text}");
        assert_eq!(serde_json::from_str::<CostQuery>(&text).unwrap(), q);
        let a = Some(answer());
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Option<CostAnswer>>(&text).unwrap(), a);
        assert_eq!(serde_json::from_str::<Option<CostAnswer>>("null").unwrap(), None);
    }

    #[test]
    fn slower_everywhere_scales_each_side_by_its_uncertainty() {
        let a = answer();
        let (alone, beside) = (
            a.estimate("vulkan", false).unwrap(),
            a.estimate("vulkan", true).unwrap(),
        );
        assert!(a.estimate("cpu", false).is_none());
        // 13 ms against 10 ms: slower at every corner of +-10% / +-25%.
        assert!(a.slower_everywhere(beside, alone));
        assert!(!a.slower_everywhere(alone, beside));
        assert!(!a.slower_everywhere(alone, alone));
        // Close enough that a corner reverses the order: not slower everywhere.
        let close = e("vulkan", true, 0.004, 0.0065);
        assert!(close.tokens_per_s < alone.tokens_per_s);
        assert!(!a.slower_everywhere(&close, alone));
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("8GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes(" 512 MiB "), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5gib"), Ok(3 << 29));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["", "GiB", "8 parsecs", "0", "-1GiB", "1.2.3G"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse_bytes("8 parsecs").unwrap_err().contains("parsecs"));
    }

    #[test]
    fn the_budget_is_the_limit_but_never_more_than_the_device() {
        let mut o = BackendOptions::default();
        assert_eq!(o.memory_budget(1 << 30).unwrap(), 1 << 30);
        o.set(MEMORY_LIMIT, "512MiB");
        assert_eq!(o.memory_budget(1 << 30).unwrap(), 512 << 20);
        o.set(MEMORY_LIMIT, "2GiB");
        let e = o.memory_budget(1 << 30).unwrap_err().to_string();
        assert!(
            e.contains("memory_limit") && e.contains("2.00 GiB") && e.contains("1.00 GiB"),
            "{e}"
        );
        o.set(MEMORY_LIMIT, "lots");
        assert!(o.memory_budget(1 << 30).unwrap_err().to_string().contains("lots"));
    }
}
