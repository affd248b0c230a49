//! tandem's backend interface: the [`ComputeBackend`] trait every backend implements, the
//! tensor descriptions and op set it speaks, its typed errors, and the plugin ABI through which
//! the engine loads backends at run time.
//!
//! A backend works at graph level: the engine builds a [`Graph`] of [`Op`]s once per shape,
//! the backend compiles it once ([`ComputeBackend::compile`]) and replays it every step
//! ([`ComputeBackend::execute`]) with small [`StepArgs`].
//!
//! The crate root is the contract. [`kit`] holds what backend authors share besides it: buffer
//! and program tables, step-argument checks, GPU planning helpers and the block decoders.

#![warn(missing_docs)]

mod backend;
pub mod block;
pub mod boundary;
mod dtype;
mod error;
mod graph;
pub mod kit;
pub mod plugin;
mod tensor;

pub use backend::{
    parse_bytes, BackendInfo, BackendOptions, BackendPlugin, ComputeBackend, DeviceKind, MemoryUse, NodeTime,
    ProgramId, Support, Ticket, HOST_WEIGHTS_FEATURE, MEMORY_LIMIT,
};
pub use backend::{CostAnswer, CostQuery, ModelShape, PeerUnit, PlacementEstimate};
pub use boundary::{SharedTimeline, TimelineId, HOST_IMPORT_ALIGN};
pub use dtype::DType;
pub use error::BackendError;
pub use graph::{
    Graph, GraphBuilder, KvCacheRef, Node, Op, RowCount, StepArgs, ValueId, ValueShape, WeightRef, TOP_K_MAX,
};
pub use plugin::abi::API_VERSION;
pub use tensor::{BufferId, TensorDesc, Usage};
