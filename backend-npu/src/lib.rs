//! tandem's AMD XDNA NPU backend
