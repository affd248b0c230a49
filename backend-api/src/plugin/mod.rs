//! The plugin boundary. A backend crate builds as a `cdylib` exporting one `extern "C"` entry
//! point, [`abi::ENTRY_SYMBOL`], which returns a `#[repr(C)]` [`abi::PluginDescriptor`]: magic,
//! ABI version, backend-api version, name and a table of `extern "C"` functions over an opaque
//! handle. Structured values (graphs, ops, errors, infos) cross it as JSON; per-step data
//! (step arguments, buffer bytes) crosses as raw pointers and lengths, without copies.
//!
//! - Backend side: [`crate::export_backend!`] writes the entry point and the table for any
//!   [`crate::BackendPlugin`], catching panics so that none crosses the boundary.
//! - Host side (feature `host`): `host::PluginLibrary` opens a library, checks the
//!   descriptor before calling anything else, and wraps the table back into a
//!   `Box<dyn ComputeBackend>`.

pub mod abi;
#[doc(hidden)]
pub mod export;
#[cfg(feature = "host")]
pub mod host;
