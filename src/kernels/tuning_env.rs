//! The one parser of the tuning variables (`POLYATTN_CUDA_*`, `POLYATTN_WGPU_*`): a variable
//! that is unset gives the default; one that does not parse gives the default and one
//! `tracing` warning naming the variable, the value, what was expected and the default used.
//! Each family's `Tuning::from_env` reads through it, and so do the runtimes' few knobs
//! (`device::wgpu::PipelineTuning`), so every knob behaves the same way; the lookup is a
//! parameter, so the parsing is unit-tested without touching the process environment.
//!
//! It lives with the kernel families, the lowest layer that reads knobs, so that neither the
//! families nor the runtimes reach up into `backends/` for it.

/// Where variables are read from: the process environment, or a table in tests.
pub(crate) struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl<'a> Env<'a> {
    /// Variables read through `lookup` (`None`: unset).
    pub(crate) fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Env { lookup }
    }

    /// The raw value of `name`, if set.
    pub(crate) fn raw(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
    }

    /// `name` parsed by `parse` (given the trimmed value); `default` when unset or when
    /// `parse` rejects the value, which is warned about with `expected` (what the variable
    /// takes) and `default_text` (what runs instead).
    pub(crate) fn get<T>(
        &self,
        name: &str,
        expected: &str,
        default: T,
        default_text: impl std::fmt::Display,
        parse: impl Fn(&str) -> Option<T>,
    ) -> T {
        match self.raw(name) {
            None => default,
            Some(v) => parse(v.trim()).unwrap_or_else(|| {
                tracing::warn!("{name}={v} is not {expected}; using the default ({default_text})");
                default
            }),
        }
    }

    /// An on / off switch: `0|off|false|no` or `1|on|true|yes` (case-insensitive).
    pub(crate) fn switch(&self, name: &str, default: bool) -> bool {
        let text = if default { "on" } else { "off" };
        self.get(name, "0 or 1 (or off / on)", default, text, parse_switch)
    }

    /// An integer in `range`.
    pub(crate) fn int_in<T>(&self, name: &str, range: std::ops::RangeInclusive<T>, default: T) -> T
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        let expected = format!("an integer from {} to {}", range.start(), range.end());
        self.get(name, &expected, default, default, |v| {
            v.parse::<T>().ok().filter(|n| range.contains(n))
        })
    }

    /// Optionally one of `values` (`None` when unset or rejected; `default_text` says what
    /// runs then).
    pub(crate) fn one_of(&self, name: &str, values: &[u32], default_text: &str) -> Option<u32> {
        let list: Vec<String> = values.iter().map(u32::to_string).collect();
        let expected = format!("one of {}", list.join(", "));
        self.get(name, &expected, None, default_text, |v| {
            v.parse::<u32>()
                .ok()
                .filter(|n| values.contains(n))
                .map(Some)
        })
    }
}

/// Parses an on / off switch: `0|off|false|no` or `1|on|true|yes` (case-insensitive).
pub(crate) fn parse_switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "0" | "off" | "false" | "no" => Some(false),
        "1" | "on" | "true" | "yes" => Some(true),
        _ => None,
    }
}

/// The process environment as an [`Env`] lookup.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A lookup over fixed `(name, value)` pairs, for the families' tuning tests.
#[cfg(test)]
pub(crate) fn table(
    pairs: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_parsed_and_rejected_values() {
        let lookup = table(&[
            ("A", " 1 "),
            ("B", "OFF"),
            ("C", "maybe"),
            ("N", "7"),
            ("M", "0"),
        ]);
        let env = Env::new(&lookup);
        assert!(env.switch("A", false));
        assert!(!env.switch("B", true));
        assert!(env.switch("C", true), "a rejected value keeps the default");
        assert!(!env.switch("C", false));
        assert!(env.switch("unset", true));
        assert_eq!(env.int_in("N", 1..=8, 3), 7);
        assert_eq!(
            env.int_in("M", 1..=8, 3),
            3,
            "out of range keeps the default"
        );
        assert_eq!(env.int_in("C", 1..=8, 3), 3);
        assert_eq!(env.one_of("N", &[1, 7], "auto"), Some(7));
        assert_eq!(env.one_of("M", &[1, 7], "auto"), None);
        assert_eq!(env.one_of("unset", &[1, 7], "auto"), None);
    }
}
