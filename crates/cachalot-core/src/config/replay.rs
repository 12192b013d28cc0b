//! [`ConfigReplay`]: a sequence of config strings kept in bounded space.

use super::syntax::parse_entries;
use super::{AllocatorConfig, sticky_field};
use crate::error::ConfigError;

/// The net effect of a sequence of config strings applied in order, kept in
/// bounded space: what a new allocator must replay to end up configured as
/// if it had seen every string (the C ABI's `cachalot_set_config` stores one
/// of these, not every string it was given).
///
/// Every parse resets the same four keys, so only the last string matters
/// for them; for every other key only the last value named matters. So the
/// sequence is at most two strings: the last value of each non-reset key
/// named before the last string, then the last string verbatim (which stays
/// the config's `last_config_string`). It holds at most one entry per field
/// and each string is at most [`MAX_CONFIG_LEN`](super::MAX_CONFIG_LEN) bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigReplay {
    /// The configuration the strings produce over the base.
    config: AllocatorConfig,
    /// `(field, "key:value")` of every non-reset key named before `last`, in
    /// the order first named; one per field.
    sticky: Vec<(&'static str, String)>,
    /// The last string pushed, with its own non-reset entries.
    last: Option<(String, Vec<(&'static str, String)>)>,
}

impl ConfigReplay {
    /// An empty sequence over `base`, the configuration the strings will be
    /// applied to (an allocator's configuration from the environment).
    pub fn new(base: AllocatorConfig) -> Self {
        Self {
            config: base,
            sticky: Vec::new(),
            last: None,
        }
    }

    /// Applies `s` after the strings so far. An error (the same as
    /// [`AllocatorConfig::apply`] on the result so far gives) changes nothing.
    pub fn push(&mut self, s: &str) -> Result<(), ConfigError> {
        let own: Vec<(&'static str, String)> = parse_entries(s)?
            .iter()
            .filter_map(|e| Some((sticky_field(e.key)?, format!("{}:{}", e.key, e.raw))))
            .collect();
        self.config.apply(s)?;
        if let Some((_, prev)) = self.last.take() {
            for (field, text) in prev {
                match self.sticky.iter_mut().find(|(f, _)| *f == field) {
                    Some(slot) => slot.1 = text,
                    None => self.sticky.push((field, text)),
                }
            }
        }
        self.last = Some((s.to_string(), own));
        Ok(())
    }

    /// The strings to apply, in order, to a configuration equal to the base
    /// to end as [`ConfigReplay::config`]: none, one or two.
    pub fn strings(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(2);
        if !self.sticky.is_empty() {
            let v: Vec<&str> = self.sticky.iter().map(|(_, t)| t.as_str()).collect();
            out.push(v.join(","));
        }
        out.extend(self.last.as_ref().map(|(s, _)| s.clone()));
        out
    }

    /// The configuration the strings produce over the base.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Bytes of config text held (the sticky values and the last string;
    /// not the [`ConfigReplay::config`]): bounded however many strings were
    /// pushed.
    pub fn stored_bytes(&self) -> usize {
        let texts = |v: &[(&str, String)]| v.iter().map(|(_, t)| t.len()).sum::<usize>();
        texts(&self.sticky)
            + self
                .last
                .as_ref()
                .map_or(0, |(s, own)| s.len() + texts(own))
    }
}
