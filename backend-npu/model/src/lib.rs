//! tandem's NPU cost model, calibrated against published XDNA2 figures, and the laptop iGPU
//! roofline beside it. Pure arithmetic with no device code, a detail of the NPU backend
//! (`tandem-npu`): its `npu-sim` prints the calibration and the laptop ranking, and its
//! `ComputeBackend::estimate_decode` answers the engine's `auto`, which asks which placements
//! are worth measuring on a machine with an NPU. The engine does not link this crate.
//!
//! SIMULATED: nothing here ran on an NPU or a laptop iGPU.
//!
//! Modules: [`gpu`] (the Gemma 3 shapes and the iGPU roofline), [`params`] (every calibrated
//! parameter with its source) and [`calibration`] (the model fitted to FastFlowLM's figures, the
//! placements it ranks, and what `auto` asks of it).

pub mod calibration;
pub mod gpu;
pub mod params;
