//! What the run time tells its user along the way without failing: a plugin that did not load,
//! a backend passed over and why, and the steps of a long wait. The caller decides where it goes
//! (the CLI prints notes and warnings, and progress only on a terminal).

use std::fmt;

/// A message for the user that is not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Something is wrong but the work goes on (a plugin file that failed to load).
    Warning(String),
    /// What the engine chose and why (a backend it degraded to).
    Note(String),
    /// A step of a long wait (each placement `auto` measures): for a terminal, nothing to keep.
    Progress(String),
}

impl Notice {
    /// Whether this is a [`Notice::Progress`] step.
    pub fn is_progress(&self) -> bool {
        matches!(self, Notice::Progress(_))
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Warning(m) => write!(f, "warning: {m}"),
            Notice::Note(m) => write!(f, "note: {m}"),
            Notice::Progress(m) => write!(f, "{m}"),
        }
    }
}
