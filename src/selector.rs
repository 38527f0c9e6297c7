//! The selector: which backend runs a configuration (vLLM's `get_attn_backend`).
//!
//! Automatic selection walks the registry in ranking order (CUDA, HIP, Vulkan, wgpu, CPU),
//! skips backends that are unavailable on this machine or invalid for the configuration, and
//! takes the first that fits; the answer is cached per configuration. `POLYATTN_BACKEND=<name>`
//! (case-insensitive; `auto` or empty = automatic) forces one backend: if it is unknown,
//! unavailable or invalid, that is an error with the reasons and the valid names, never a
//! silent fallback (vLLM 0.25.1 behaves the same for `--attention-backend`).

use crate::backend::{Availability, BackendRef, Reason, SelectorConfig};
use crate::error::{Error, Result};
use crate::registry::{self, Registry};

/// The environment variable that forces a backend.
pub const BACKEND_ENV: &str = "POLYATTN_BACKEND";

/// One backend's verdict for a configuration.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Backend name.
    pub name: String,
    /// Its ranking value.
    pub priority: u32,
    /// Available on this machine, or why not.
    pub availability: Availability,
    /// Why it cannot run the configuration (empty: it can).
    pub reasons: Vec<Reason>,
}

impl Candidate {
    /// True if it can run the configuration here.
    pub fn is_usable(&self) -> bool {
        self.availability.is_available() && self.reasons.is_empty()
    }
}

/// The backend forced by `POLYATTN_BACKEND`, if any (`auto` and empty mean none).
pub fn forced_backend_from_env() -> Option<String> {
    let v = std::env::var(BACKEND_ENV).ok()?;
    let v = v.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("auto") {
        None
    } else {
        Some(v.to_string())
    }
}

fn candidate(b: &BackendRef, config: &SelectorConfig) -> Candidate {
    let availability = b.availability();
    let reasons = b.validate_configuration(config);
    Candidate {
        name: b.name().to_string(),
        priority: b.priority(),
        availability,
        reasons,
    }
}

fn all_reasons(c: &Candidate) -> Vec<Reason> {
    let mut r = Vec::new();
    if let Availability::Unavailable(why) = &c.availability {
        r.push(Reason::new("backend unavailable", why.clone()));
    }
    r.extend(c.reasons.iter().cloned());
    r
}

impl Registry {
    /// Every backend's verdict for `config`, in ranking order ("why not?" for users).
    pub fn explain(&self, config: &SelectorConfig) -> Vec<Candidate> {
        self.backends()
            .iter()
            .map(|b| candidate(b, config))
            .collect()
    }

    /// Selects a backend for `config`; `forced` names one (as `POLYATTN_BACKEND` does).
    pub fn select(&self, config: &SelectorConfig, forced: Option<&str>) -> Result<BackendRef> {
        let key = (forced.map(|s| s.to_ascii_uppercase()), config.clone());
        if let Some(name) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
        {
            if let Some(b) = self.get(&name) {
                return Ok(b);
            }
        }
        let chosen = match forced {
            Some(name) => {
                let b = self.get(name).ok_or_else(|| Error::UnknownBackend {
                    name: name.to_string(),
                    valid: self.names(),
                })?;
                let c = candidate(&b, config);
                if !c.is_usable() {
                    return Err(Error::ForcedBackendInvalid {
                        name: c.name.clone(),
                        reasons: all_reasons(&c),
                        valid: self.names(),
                    });
                }
                tracing::info!("Using {} backend (forced by {BACKEND_ENV}).", b.name());
                b
            }
            None => {
                let mut rejected = Vec::new();
                let mut found = None;
                for b in self.backends() {
                    let c = candidate(&b, config);
                    if c.is_usable() {
                        found = Some(b);
                        break;
                    }
                    tracing::debug!("backend {} rejected: {:?}", c.name, all_reasons(&c));
                    rejected.push((c.name.clone(), all_reasons(&c)));
                }
                let b = found.ok_or_else(|| Error::NoValidBackend {
                    config: config.to_string(),
                    rejected,
                })?;
                tracing::info!("Using {} attention backend.", b.name());
                b
            }
        };
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, chosen.name().to_string());
        Ok(chosen)
    }
}

/// Selects the backend for `config` from the global registry, honouring `POLYATTN_BACKEND`.
pub fn get_attn_backend(config: &SelectorConfig) -> Result<BackendRef> {
    registry::global().select(config, forced_backend_from_env().as_deref())
}

/// Every backend's verdict for `config` in the global registry.
pub fn explain(config: &SelectorConfig) -> Vec<Candidate> {
    registry::global().explain(config)
}
