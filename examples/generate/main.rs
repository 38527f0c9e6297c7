//! Generates text with a Llama-family model through polyattn (work in progress).
#![allow(dead_code)]

mod bpe;
mod gguf;

fn main() {}
