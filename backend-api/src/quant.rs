//! Block-quantized formats (in progress).
