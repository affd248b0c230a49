//! One module per subcommand.

pub mod backends;
pub mod bench;
pub mod chat;
pub mod generate;
pub mod load;
pub mod loadgen;
pub mod logits;
pub mod perplexity;
pub mod placement;
pub mod progress;
pub mod run;
pub mod serve;
pub mod speculate;
pub mod synth;
pub mod tokenize;
