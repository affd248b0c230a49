//! Why a model could not be placed or loaded: [`LoadError`], and [`BudgetError`] for a unit
//! that cannot hold what the placement gives it. Below every load step, so that each of them
//! (planning, budgets, calibration, the upload) can return it.

use std::path::PathBuf;

use super::placement::{PlacementError, SpecError};
use super::placement_report::gib;
use super::split::ScheduleError;
use crate::model::ModelError;

/// Why a model could not be loaded onto its units.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No backend, or no placement.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The model's files are unusable.
    #[error(transparent)]
    Model(Box<ModelError>),
    /// A zero context or chunk.
    #[error("the context and the prompt chunk must be at least 1 token")]
    ZeroSize,
    /// `auto` could not measure any placement.
    #[error("calibrating the automatic placement: {0}")]
    Calibration(String),
    /// The weights could not be uploaded.
    #[error("loading {}", path.display())]
    Upload {
        /// The model file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<ModelError>,
    },
    /// A unit cannot hold what the placement gives it.
    #[error(transparent)]
    Budget(Box<BudgetError>),
    /// The units could not be set up to run the placed graph.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The vision tower could not be found or loaded.
    #[error(transparent)]
    Images(Box<super::images::ImagesError>),
}

impl From<SpecError> for LoadError {
    fn from(e: SpecError) -> Self {
        LoadError::Placement(e.into())
    }
}

impl From<ModelError> for LoadError {
    fn from(e: ModelError) -> Self {
        LoadError::Model(Box::new(e))
    }
}

/// A unit that cannot hold what the placement gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the model does not fit {unit}: it needs {} there (weights {}, KV cache {}, activations about {}) and {unit} may use {} ({source_of_budget}); {hint}",
    gib(*need), gib(*weights), gib(*kv_cache), gib(*activations), gib(*budget)
)]
pub struct BudgetError {
    /// The unit's instance name.
    pub unit: String,
    /// Bytes it would need.
    pub need: u64,
    /// Of which weights.
    pub weights: u64,
    /// Of which KV caches.
    pub kv_cache: u64,
    /// Of which activations (an estimate).
    pub activations: u64,
    /// Bytes it may use.
    pub budget: u64,
    /// Where that budget comes from.
    pub source_of_budget: String,
    /// What to do about it.
    pub hint: String,
}

impl From<BudgetError> for LoadError {
    fn from(e: BudgetError) -> Self {
        LoadError::Budget(Box::new(e))
    }
}
