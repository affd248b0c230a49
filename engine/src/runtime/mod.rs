//! The run time, in the order a request meets it:
//! - [`plugins`] finds the backend plugins, [`settings`] reads `tandem.toml`;
//! - [`placement`] turns `--backend` and `[placement]` into preference lists and units, and puts
//!   every node of the step graph on one ([`layers`] places whole layers: `--gpu-layers`,
//!   `[placement.layers]`); [`budget`] checks what each unit holds against its memory, and fits
//!   layers to it ([`device_budget`]: a limit binds every backend on its device);
//!   [`placement_report`] says what that costs; [`offload`] runs the products of CPU-held
//!   layers on the GPU for prefill;
//! - [`load`] decides the placement (with [`adapters`] telling `auto` what each backend offers
//!   and [`calibrate`] measuring), then [`planned`]
//!   uploads the model onto its units: the one load path, one backend being a split of one;
//! - [`split`] is the split scheduler: the step's programs per unit, the copies between units,
//!   micro-batches, the KV hand-off between phases;
//! - [`session`] holds the model on its units and the KV cache slots, and runs steps;
//! - [`sequence`] is the generation loop (`run`, `chat` and `serve` alike): [`sampler`] picks
//!   tokens, [`stop`] finds stop strings;
//! - [`notice`] carries warnings and notes for the user.

pub mod adapters;
pub mod budget;
pub mod calibrate;
pub mod device_budget;
pub mod environment;
pub mod fitted;
pub mod images;
pub mod layers;
pub mod load;
pub mod load_error;
pub mod notice;
pub mod offload;
pub mod placement;
pub mod placement_report;
pub mod planned;
pub mod plugins;
pub mod sampler;
pub mod sequence;
pub mod session;
pub mod settings;
pub mod speculative;
pub mod split;
pub mod stepper;
pub mod stop;
pub mod vision_plan;
