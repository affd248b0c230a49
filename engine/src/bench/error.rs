//! Why a benchmark could not run.

use std::path::PathBuf;

use tandem_backend_api::BackendError;

use crate::checkpoint::synth::SynthError;
use crate::runtime::load::LoadError;
use crate::runtime::placement::PlacementError;
use crate::runtime::session::SessionError;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The options are unusable.
    #[error("{0}")]
    Options(String),
    /// The synthetic model could not be named or written.
    #[error(transparent)]
    Synth(#[from] SynthError),
    /// A directory could not be created.
    #[error("creating {}", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The model could not be loaded.
    #[error(transparent)]
    Load(Box<LoadError>),
    /// No backend for the peak measurement.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A step failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The backend has no matmul to measure its peak with (its name).
    #[error("the {0} backend supports no f32, f16 or q8_0 matmul to measure its peak")]
    NoPeak(String),
}

impl From<LoadError> for BenchError {
    fn from(e: LoadError) -> Self {
        BenchError::Load(Box::new(e))
    }
}
