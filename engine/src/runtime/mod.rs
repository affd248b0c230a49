//! The run time: backend plugins ([`plugins`]), the config file ([`settings`]), generation state
//! ([`session`]) and token choice ([`sampler`]).

pub mod plugins;
pub mod sampler;
pub mod session;
pub mod settings;
