//! tandem's NPU cost model, calibrated against published XDNA2 figures, and the laptop iGPU
//! roofline beside it. Pure arithmetic with no device code, so that both the NPU backend
//! (`tandem-npu`, whose `npu-sim` prints the calibration and the laptop ranking) and the engine
//! (whose `auto` uses the ranking to choose which placements to measure on a machine with an
//! NPU) can use it; the engine does not link the NPU backend, which is a plugin.
//!
//! SIMULATED: nothing here ran on an NPU or a laptop iGPU.
//!
//! Modules: [`gpu`] (the Gemma 3 shapes and the iGPU roofline), [`params`] (every calibrated
//! parameter with its source) and [`calibration`] (the model fitted to FastFlowLM's figures, the
//! placements it ranks, and what `auto` asks of it).

pub mod calibration;
pub mod gpu;
pub mod params;
