//! Benchmarks: [`run`] measures a model's prefill and decode speed on a backend against the limits
//! the same run measures ([`limits`]) and writes the `tandem-bench/1` result, whose data types are
//! [`results`]. Reading results back and rendering them is the command line's (`tandem_cli::report`).
//! [`divergence`] measures quality rather than speed: a run's next-token distributions against a
//! reference run's (`engine perplexity --kl-divergence`). [`verify`] is speculative decoding's
//! verification cost curve (`engine bench --verify-rows N`).

pub mod divergence;
pub mod error;
pub mod limits;
pub mod machine;
pub mod results;
pub mod run;
pub mod verify;
