//! The subcommands of the `polyattn` binary.

pub mod check;
pub mod config;
pub mod fuzz;
pub mod info;
pub mod log;

use polyattn::{registry, Availability, BackendRef, Error, Reason, Result};

/// The backends a subcommand runs on: the one `forced` names (an error if it is unknown or
/// unavailable here), else every available standard (non-MLA) backend in ranking order.
pub fn run_on(forced: Option<String>) -> Result<Vec<BackendRef>> {
    let reg = registry::global();
    match forced {
        Some(name) => {
            let b = reg.get(&name).ok_or_else(|| Error::UnknownBackend {
                name: name.clone(),
                valid: reg.names(),
            })?;
            if let Availability::Unavailable(why) = b.availability() {
                return Err(Error::ForcedBackendInvalid {
                    name: b.name().into(),
                    reasons: vec![Reason::new("backend unavailable", why)],
                    valid: reg.names(),
                });
            }
            Ok(vec![b])
        }
        // MLA backends run no standard batch (check, fuzz): they are left out unless named.
        None => Ok(reg
            .backends()
            .into_iter()
            .filter(|b| b.availability().is_available() && !b.capabilities().is_mla)
            .collect()),
    }
}
