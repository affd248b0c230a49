//! The run time: backend plugins ([`plugins`]), the config file ([`settings`]), which backend runs
//! the model ([`placement`]), loading a model onto it ([`load`]), generation state ([`session`])
//! and token choice ([`sampler`]).

pub mod calibrate;
pub mod load;
pub mod notice;
pub mod placement;
pub mod placement_report;
pub mod plugins;
pub mod sampler;
pub mod schedule;
pub mod session;
pub mod settings;
