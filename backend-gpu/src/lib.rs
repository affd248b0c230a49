//! tandem's GPU compiler, shared by the GPU backends (Vulkan, `backend-vulkan`; wgpu,
//! `backend-wgpu-fallback`): everything about turning a graph into dispatches that does not
//! depend on the API that records them. Each backend keeps its device, memory, kernels and the
//! recording of its dispatches, and decides through this crate:
//!
//! - [`support`]: which ops its kernels take ([`support::op_support`] under the backend's
//!   [`support::Coverage`]), for `supports` and `compile` alike;
//! - [`options`]: its options, each an option, else an environment variable, else a default;
//! - [`fuse`]: which nodes run as one kernel, under the backend's [`fuse::Rules`];
//! - [`plan`]: the value arena (fused groups at their time) and per-node profile times;
//! - [`attention`]: attention's splits and their scratch, and when prefill takes the tiled
//!   kernel;
//! - [`matmul`]: where decode ends, the q4_k decode matvec's shape, the integer-dot matvec's
//!   rows and columns per workgroup;
//! - [`launch`]: workgroup counts and their layout;
//! - [`params`]: parameter words both backends' kernels read alike (norm weight formats, rope
//!   frequencies, split ends).
//!
//! It knows no graphics API: it sees graphs, ops and numbers, and answers with numbers.

pub mod attention;
pub mod fuse;
pub mod launch;
pub mod matmul;
pub mod options;
pub mod params;
pub mod plan;
pub mod support;

pub use support::{check_ops, op_support, Coverage};
