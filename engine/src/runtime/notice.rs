//! What the run time tells its user along the way without failing: a plugin that did not load,
//! a backend passed over and why. The caller decides where it goes (the CLI prints it).

use std::fmt;

/// A message for the user that is not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Something is wrong but the work goes on (a plugin file that failed to load).
    Warning(String),
    /// What the engine chose and why (a backend it degraded to).
    Note(String),
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Warning(m) => write!(f, "warning: {m}"),
            Notice::Note(m) => write!(f, "note: {m}"),
        }
    }
}
