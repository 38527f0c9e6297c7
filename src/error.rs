//! The one error type of polyattn.
//!
//! Every message says what was wrong and, where there is one, what would be valid: a user who
//! sees it should not need to read the source to fix the call.

use crate::capability::Reason;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in polyattn.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor had the wrong shape for its role.
    #[error("{what}: shape {got:?} is invalid, expected {expected}")]
    Shape {
        /// Which argument (e.g. "query").
        what: &'static str,
        /// The shape that was passed.
        got: Vec<usize>,
        /// A description of the shape that is valid.
        expected: String,
    },

    /// A tensor had the wrong dtype for its role.
    #[error("{what}: dtype {got} is invalid, expected {expected}")]
    DType {
        /// Which argument.
        what: &'static str,
        /// The dtype that was passed.
        got: String,
        /// The dtype(s) that are valid.
        expected: String,
    },

    /// The per-batch metadata is inconsistent (validated once, when it is built).
    #[error("invalid attention metadata: {0}")]
    Metadata(String),

    /// A layer or backend parameter is out of range (head size, GQA ratio, window, ...).
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The backend cannot run this configuration; the reasons are vLLM's reason strings.
    #[error("backend {backend} is not valid for this configuration: {}", join_reasons(.reasons))]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// Why it cannot run it.
        reasons: Vec<Reason>,
    },

    /// `POLYATTN_BACKEND` (or a forced name) named no registered backend.
    #[error("unknown attention backend '{name}'; valid names: {}", .valid.join(", "))]
    UnknownBackend {
        /// The name that was asked for.
        name: String,
        /// Every registered name.
        valid: Vec<String>,
    },

    /// A forced backend exists but cannot be used here (its driver or compiler is missing) or
    /// cannot run the configuration.
    #[error("forced backend {name} (POLYATTN_BACKEND) cannot be used: {}; valid names: {}",
        join_reasons(.reasons), .valid.join(", "))]
    ForcedBackendInvalid {
        /// The forced backend.
        name: String,
        /// Why it cannot be used.
        reasons: Vec<Reason>,
        /// Every registered name.
        valid: Vec<String>,
    },

    /// No registered backend can run the configuration.
    #[error("no valid attention backend for {config}. Reasons: {}", format_rejections(.rejected))]
    NoValidBackend {
        /// The configuration that was asked for, rendered.
        config: String,
        /// Every backend with its reasons.
        rejected: Vec<(String, Vec<Reason>)>,
    },

    /// A backend's device could not be opened or used.
    #[error("device error ({backend}): {message}")]
    Device {
        /// The backend or device family.
        backend: String,
        /// What the driver said.
        message: String,
    },

    /// Metadata built by one backend's builder was given to another backend's impl.
    #[error("metadata mismatch: {impl_name} expects metadata from its own builder, got {got}")]
    MetadataMismatch {
        /// The impl that received it.
        impl_name: String,
        /// The type name it got.
        got: String,
    },

    /// A size, byte count, stride or offset computed from the caller's input does not fit the
    /// integer type it must be computed in (a shape whose element count wraps around `usize`,
    /// a cache too large to address).
    #[error("{what}: size overflows: {detail}")]
    Overflow {
        /// Which argument or quantity.
        what: &'static str,
        /// The operands, so the caller sees which input was too large.
        detail: String,
    },

    /// An I/O error (benchmark output, JSON files).
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn join_reasons(reasons: &[Reason]) -> String {
    reasons
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

fn format_rejections(rejected: &[(String, Vec<Reason>)]) -> String {
    rejected
        .iter()
        .map(|(name, r)| format!("{name}: [{}]", join_reasons(r)))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Error {
    /// Shorthand for a [`Error::Shape`].
    pub(crate) fn shape(what: &'static str, got: &[usize], expected: impl Into<String>) -> Self {
        Error::Shape {
            what,
            got: got.to_vec(),
            expected: expected.into(),
        }
    }

    /// Shorthand for a [`Error::Metadata`].
    pub(crate) fn metadata(msg: impl Into<String>) -> Self {
        Error::Metadata(msg.into())
    }

    /// Shorthand for a [`Error::Overflow`].
    pub(crate) fn overflow(what: &'static str, detail: impl Into<String>) -> Self {
        Error::Overflow {
            what,
            detail: detail.into(),
        }
    }

    /// Shorthand for a [`Error::Config`].
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        Error::Config(msg.into())
    }
}
