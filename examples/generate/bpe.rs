//! Byte-level BPE tokenizer (in progress).
