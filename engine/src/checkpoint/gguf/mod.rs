//! GGUF, llama.cpp's checkpoint format: [`reader`] (memory-mapped, checked up front), [`writer`],
//! the metadata values both share ([`value`]), and [`gemma3`], Gemma 3's hyper-parameters and
//! tensors as llama.cpp's converter stores them.

pub mod gemma3;
pub mod reader;
pub mod value;
pub mod writer;

pub use gemma3::{gemma3_config, GgufWeights};
pub use reader::{GgufError, GgufFile};
