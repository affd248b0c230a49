//! One module per subcommand.

pub mod backends;
