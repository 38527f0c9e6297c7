//! The binary's `tracing` output: events at or above `POLYATTN_LOG` (`error`, `warn`,
//! `info`, `debug`, `trace`; default `warn`) go to stderr, one line each.
//!
//! Why: the library reports through `tracing` (a tuning variable that does not parse, a tile
//! that does not fit the adapter, wgpu's uncaptured errors) and leaves the output to the
//! application. Without a subscriber those warnings vanish, so `polyattn` installs this small
//! one (spans are not tracked: the library emits events only).

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Environment variable with the most verbose level printed.
pub const LOG_ENV: &str = "POLYATTN_LOG";

/// Prints events at `max` or more severe to stderr.
struct StderrLog {
    max: Level,
}

/// Collects an event's message and its other fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for StderrLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // Levels compare by verbosity: ERROR < WARN < ... < TRACE.
        *metadata.level() <= self.max
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        let meta = event.metadata();
        eprintln!(
            "polyattn {} {}: {}{}",
            meta.level().as_str().to_ascii_lowercase(),
            meta.target(),
            line.message,
            line.fields
        );
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// The level `POLYATTN_LOG` asks for (`warn` when unset); an unknown value is reported on
/// stderr and `warn` is used.
fn level_from_env() -> Level {
    match std::env::var(LOG_ENV) {
        Err(_) => Level::WARN,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!(
                "polyattn: {LOG_ENV}={v} is not error, warn, info, debug or trace; using warn"
            );
            Level::WARN
        }),
    }
}

/// Installs the stderr subscriber for the process (a no-op if one is already set).
pub fn init() {
    let _ = tracing::subscriber::set_global_default(StderrLog {
        max: level_from_env(),
    });
}
