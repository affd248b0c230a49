//! GGUF files (in progress).
