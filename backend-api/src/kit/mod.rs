//! The implementer's kit: what every backend needs besides its kernels, written once. The
//! contract (the [`crate::ComputeBackend`] trait, graphs, dtypes, errors, tensors, the plugin
//! ABI) lives at the crate root; this module is for backend authors only, as ggml splits its
//! public header from its implementer's one.
//!
//! A backend keeps two tables and, when it runs synchronously, a ticket counter:
//!
//! ```text
//! buffers: Buffers<MyBuffer>,    // kit::buffers
//! programs: Programs<MyProgram>, // kit::programs
//! tickets: Tickets,              // kit::programs
//! ```
//!
//! and its trait methods reduce to glue around its kernels:
//!
//! - `alloc`: make the memory, then `buffers.insert(..)` issues the id; `read`/`write` look the
//!   buffer up with `buffers.get(id)?` (`unknown buffer N`).
//! - `compile`: `graph.infer_shapes()?`, the backend's own op checks,
//!   [`buffers::check_buffers`] (every buffer the graph names against what it holds; returns
//!   the buffers the program uses), the backend's planning (for GPUs the crate
//!   `tandem-gpu-kit`: arena, workgroups, attention splits, fusion), then
//!   `programs.insert(program, used, StepShape::of(graph))`.
//! - `execute`: `programs.for_step(id, args)?` finds the program and checks the step's
//!   arguments against its graph ([`step::StepShape::check`]), then the backend runs it and
//!   returns `tickets.issue()` (or its queue's submission number).
//! - `wait`: `tickets.check(ticket)?` ([`programs::check_ticket`] for a queue's numbers), then
//!   the backend waits.
//! - `free`: `buffers.free(id, &programs)?` refuses a buffer a program still names
//!   (`buffer 7 is used by program 3: release it first`) and hands back the buffer to destroy.
//! - `release`: `programs.release(id)?` hands back the program to destroy.
//!
//! [`plan::value_rows`] counts a value's rows. [`quant`] decodes ggml's block formats (reference decoders, for CPU kernels and tests);
//! [`host::host_memory_bytes`] is the device figure of backends that keep buffers in host
//! memory, for their [`crate::MEMORY_LIMIT`] budget.

pub mod buffers;
pub mod host;
pub mod plan;
pub mod programs;
pub mod quant;
pub mod step;
pub mod top_k;

pub use buffers::{check_buffers, named_buffers, unknown_buffer, Buffers};
pub use host::{check_host_region, host_memory_bytes};
pub use programs::{check_ticket, unknown_program, Compiled, Programs, Tickets};
pub use step::StepShape;
