//! GGUF v3 reader (in progress).
