//! The subcommands of the `polyattn` binary.

pub mod check;
pub mod config;
pub mod fuzz;
pub mod info;
pub mod log;
