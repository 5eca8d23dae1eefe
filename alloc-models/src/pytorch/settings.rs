//! The allocator's options, parsed as `PYTORCH_CUDA_ALLOC_CONF` spells them
//! (`c10/core/AllocatorConfig.cpp`: `parseArgs` and its `parse*` helpers) and as a snapshot's
//! `allocator_settings` records them, with PyTorch's defaults and checks.

use super::LARGE_BUFFER;

/// Intervals of `roundup_power2_divisions`: [1 MiB, 2 MiB), [2, 4), ..., [32 GiB, 64 GiB) and
/// above; sizes below 1 MiB use the first (`kRoundUpPowerOfTwoIntervals`).
pub const INTERVALS: usize = 16;

const MB: u64 = 1 << 20;

/// The options that change where the allocator places blocks and how much it reserves.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Blocks of at least this size are never split, and serve only requests of at least this
    /// size (`max_split_size_mb`; `u64::MAX`, the default, means no limit).
    pub max_split_size: u64,
    /// An unsplittable block serves a request only if it is less than this much larger
    /// (`max_non_split_rounding_mb`; 20 MiB by default).
    pub max_non_split_rounding: u64,
    /// Per interval (see [`INTERVALS`]): round sizes up to one of this many steps between two
    /// powers of two (0 or 1: 512-byte steps).
    pub roundup_power2_divisions: [u64; INTERVALS],
    /// Reclaim unused cached segments, oldest first, once the reserved bytes pass this
    /// fraction of the allowed memory (0: off). Acts only with a memory fraction set.
    pub garbage_collection_threshold: f64,
    /// One growing segment per stream and pool, mapped in pages on demand.
    pub expandable_segments: bool,
    /// `torch.cuda.set_per_process_memory_fraction`: the allocator may reserve at most this
    /// fraction of the device's memory (`None`: not set).
    pub memory_fraction: Option<f64>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            memory_fraction: None,
        }
    }
}

/// Why a setting was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, SettingsError> {
    Err(SettingsError(msg.into()))
}

/// The keys [`Settings::set`] knows, for help and errors.
pub const KEYS: &[&str] = &[
    "expandable_segments",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
];

impl Settings {
    /// Settings from a `PYTORCH_CUDA_ALLOC_CONF` string (`key:value,key:value`), over the
    /// defaults. Options that do not change placement (`backend:native`,
    /// `release_lock_on_cudamalloc`, the pinned-memory ones) are accepted and ignored.
    pub fn parse(conf: &str) -> Result<Settings, SettingsError> {
        let mut s = Settings::default();
        s.apply(conf)?;
        Ok(s)
    }

    /// Applies a `PYTORCH_CUDA_ALLOC_CONF` string over these settings.
    pub fn apply(&mut self, conf: &str) -> Result<(), SettingsError> {
        for (key, value) in split_options(conf)? {
            self.set(&key, &value)?;
        }
        Ok(())
    }

    /// Sets one option, `value` as `PYTORCH_CUDA_ALLOC_CONF` writes it (`True`, `512`,
    /// `[256:1,>:4]`, `0.6`), with PyTorch's checks.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SettingsError> {
        let value = value.trim();
        match key.trim() {
            "expandable_segments" => {
                self.expandable_segments = match value {
                    "True" | "true" | "1" => true,
                    "False" | "false" | "0" => false,
                    _ => {
                        return err(format!(
                            "expandable_segments takes True or False, not {value:?}"
                        ))
                    }
                }
            }
            "max_split_size_mb" => self.max_split_size = megabytes(key, value)?,
            "max_non_split_rounding_mb" => self.max_non_split_rounding = megabytes(key, value)?,
            "garbage_collection_threshold" => {
                let f: f64 = value.parse().or_else(|_| {
                    err(format!(
                        "garbage_collection_threshold takes a number, not {value:?}"
                    ))
                })?;
                if !(f > 0.0 && f < 1.0) {
                    return err("garbage_collection_threshold must be in (0.0, 1.0)");
                }
                self.garbage_collection_threshold = f;
            }
            "roundup_power2_divisions" => self.roundup_power2_divisions = divisions(value)?,
            "per_process_memory_fraction" | "memory_fraction" => {
                let f: f64 = value.parse().or_else(|_| {
                    err(format!(
                        "per_process_memory_fraction takes a number, not {value:?}"
                    ))
                })?;
                if !(f > 0.0 && f <= 1.0) {
                    return err("per_process_memory_fraction must be in (0.0, 1.0]");
                }
                self.memory_fraction = Some(f);
            }
            "backend" => {
                if value != "native" {
                    return err(format!(
                        "backend:{value} is not modelled (only PyTorch's native caching allocator)"
                    ));
                }
            }
            "release_lock_on_cudamalloc"
            | "pinned_use_cuda_host_register"
            | "pinned_num_register_threads"
            | "pinned_use_background_threads" => {}
            other => {
                return err(format!(
                    "unknown allocator setting {other:?}: expected one of {}",
                    KEYS.join(", ")
                ))
            }
        }
        Ok(())
    }

    /// Settings from a snapshot's `allocator_settings` (key, value as text): the effective
    /// values PyTorch recorded, and from the `PYTORCH_CUDA_ALLOC_CONF` string what they do not
    /// hold (`max_non_split_rounding_mb`). Unknown keys are ignored; a value that does not
    /// parse is an error.
    pub fn from_recorded(pairs: &[(String, String)]) -> Result<Settings, SettingsError> {
        let mut s = Settings::default();
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.trim())
        };
        if let Some(conf) = get("PYTORCH_CUDA_ALLOC_CONF") {
            // The last string set; the fields below are what is in effect and win.
            let mut from_conf = Settings::default();
            if from_conf.apply(conf).is_ok() {
                s = from_conf;
            }
        }
        if let Some(v) = get("max_split_size") {
            let n: i128 = v
                .parse()
                .or_else(|_| err(format!("recorded max_split_size {v:?} is not a number")))?;
            // SIZE_MAX is recorded as -1 (an int64).
            s.max_split_size = if n < 0 || n >= u64::MAX as i128 {
                u64::MAX
            } else {
                n as u64
            };
        }
        if let Some(v) = get("garbage_collection_threshold") {
            let f: f64 = v.parse().or_else(|_| {
                err(format!(
                    "recorded garbage_collection_threshold {v:?} is not a number"
                ))
            })?;
            s.garbage_collection_threshold = if f > 0.0 && f < 1.0 { f } else { 0.0 };
        }
        if let Some(v) = get("expandable_segments") {
            s.expandable_segments = matches!(v, "True" | "true" | "1");
        }
        if let Some(v) = get("roundup_power2_divisions") {
            s.roundup_power2_divisions = recorded_divisions(v)?;
        }
        Ok(s)
    }

    /// The settings that differ from PyTorch's defaults, as `PYTORCH_CUDA_ALLOC_CONF` spells
    /// them (keys in a fixed order).
    pub fn pairs(&self) -> Vec<(String, String)> {
        let d = Settings::default();
        let mut out = Vec::new();
        if self.expandable_segments {
            out.push(("expandable_segments".into(), "True".into()));
        }
        if self.max_split_size != d.max_split_size {
            out.push((
                "max_split_size_mb".into(),
                (self.max_split_size / MB).to_string(),
            ));
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            out.push((
                "max_non_split_rounding_mb".into(),
                (self.max_non_split_rounding / MB).to_string(),
            ));
        }
        if self.roundup_power2_divisions != d.roundup_power2_divisions {
            out.push(("roundup_power2_divisions".into(), self.divisions_text()));
        }
        if self.garbage_collection_threshold > 0.0 {
            out.push((
                "garbage_collection_threshold".into(),
                self.garbage_collection_threshold.to_string(),
            ));
        }
        if let Some(f) = self.memory_fraction {
            out.push(("per_process_memory_fraction".into(), f.to_string()));
        }
        out
    }

    /// These settings applied over `base`: the options these set (away from PyTorch's
    /// defaults) replace `base`'s, the others keep `base`'s (an alternative to a run's
    /// recorded settings changes what it names only).
    pub fn over(&self, base: &Settings) -> Settings {
        let d = Settings::default();
        let mut s = base.clone();
        if self.expandable_segments != d.expandable_segments {
            s.expandable_segments = self.expandable_segments;
        }
        if self.max_split_size != d.max_split_size {
            s.max_split_size = self.max_split_size;
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            s.max_non_split_rounding = self.max_non_split_rounding;
        }
        if self.roundup_power2_divisions != d.roundup_power2_divisions {
            s.roundup_power2_divisions = self.roundup_power2_divisions;
        }
        if self.garbage_collection_threshold != d.garbage_collection_threshold {
            s.garbage_collection_threshold = self.garbage_collection_threshold;
        }
        if self.memory_fraction.is_some() {
            s.memory_fraction = self.memory_fraction;
        }
        s
    }

    /// `key:value,...` of [`Settings::pairs`], or `default`.
    pub fn label(&self) -> String {
        let p = self.pairs();
        if p.is_empty() {
            return "default".into();
        }
        p.iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn divisions_text(&self) -> String {
        let d = &self.roundup_power2_divisions;
        if d.iter().all(|&x| x == d[0]) {
            return d[0].to_string();
        }
        let mut parts = Vec::new();
        for (i, &x) in d.iter().enumerate() {
            if i == 0 || x != d[i - 1] {
                parts.push(format!("{}:{x}", 1u64 << i));
            }
        }
        format!("[{}]", parts.join(","))
    }

    /// The divisions for a size (`roundup_power2_divisions(size)`): its interval is
    /// `floor(log2(size)) - 20`, clamped to the table.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as i64;
        let index = (log - 20).clamp(0, INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[index]
    }
}

fn megabytes(key: &str, value: &str) -> Result<u64, SettingsError> {
    let mb: u64 = value
        .parse()
        .or_else(|_| err(format!("{key} takes a whole number of MiB, not {value:?}")))?;
    if mb < LARGE_BUFFER / MB {
        return err(format!("{key} too small, must be >= {}", LARGE_BUFFER / MB));
    }
    Ok(mb.saturating_mul(MB))
}

/// `roundup_power2_divisions`: one power of two for every interval, or a list
/// `[interval_mb:divisions,...,>:divisions]` (`parseRoundUpPower2Divisions`): the first entry
/// also fills the intervals below it; `>` fills from the last interval named to the end.
fn divisions(value: &str) -> Result<[u64; INTERVALS], SettingsError> {
    let mut table = [0u64; INTERVALS];
    let pow2 = |n: u64| n.is_power_of_two();
    let Some(list) = value.strip_prefix('[') else {
        let n: u64 = value.parse().or_else(|_| {
            err(format!(
                "roundup_power2_divisions takes a number or a list, not {value:?}"
            ))
        })?;
        if !pow2(n) {
            return err("roundup_power2_divisions: the divisions have to be a power of 2");
        }
        return Ok([n; INTERVALS]);
    };
    let Some(list) = list.strip_suffix(']') else {
        return err(format!(
            "roundup_power2_divisions: {value:?} lacks its closing ]"
        ));
    };
    let mut first = true;
    let mut last_index = 0usize;
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((interval, n)) = item.split_once(':') else {
            return err(format!(
                "roundup_power2_divisions: {item:?} is not interval:divisions"
            ));
        };
        let n: u64 = n.trim().parse().or_else(|_| {
            err(format!(
                "roundup_power2_divisions: {n:?} is not a number of divisions"
            ))
        })?;
        if n != 0 && !pow2(n) {
            return err("roundup_power2_divisions: the divisions have to be a power of 2 or 0");
        }
        let interval = interval.trim();
        if interval == ">" {
            table[last_index..].fill(n);
            continue;
        }
        let mb: u64 = interval.parse().or_else(|_| {
            err(format!(
                "roundup_power2_divisions: {interval:?} is not an interval in MiB"
            ))
        })?;
        if !pow2(mb) {
            return err("roundup_power2_divisions: the intervals have to be powers of 2");
        }
        let index = (63 - mb.leading_zeros() as usize).min(INTERVALS - 1);
        if first {
            table[..index].fill(n);
            first = false;
        }
        table[index] = n;
        last_index = index;
    }
    Ok(table)
}

/// A recorded `roundup_power2_divisions`: a dict of interval start in MiB (as text) to
/// divisions, written here as `{1:0,2:0,...}`, or one number.
fn recorded_divisions(v: &str) -> Result<[u64; INTERVALS], SettingsError> {
    let Some(body) = v.strip_prefix('{').and_then(|b| b.strip_suffix('}')) else {
        return divisions(v);
    };
    let mut table = [0u64; INTERVALS];
    for item in body.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, n)) = item.split_once(':') else {
            return err(format!("recorded roundup_power2_divisions entry {item:?}"));
        };
        let (Ok(mb), Ok(n)) = (
            k.trim().trim_matches(['\'', '"']).parse::<u64>(),
            n.trim().parse::<u64>(),
        ) else {
            return err(format!("recorded roundup_power2_divisions entry {item:?}"));
        };
        if mb.is_power_of_two() {
            let index = 63 - mb.leading_zeros() as usize;
            if index < INTERVALS {
                table[index] = n;
            }
        }
    }
    Ok(table)
}

/// Splits `key:value,key:value` into pairs, keeping a bracketed list value whole.
fn split_options(conf: &str) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = conf.as_bytes();
    let mut push = |part: &str| -> Result<(), SettingsError> {
        let part = part.trim();
        if part.is_empty() {
            return Ok(());
        }
        let Some((k, v)) = part.split_once(':') else {
            return err(format!("allocator setting {part:?} is not key:value"));
        };
        out.push((k.trim().to_string(), v.trim().to_string()));
        Ok(())
    };
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                push(&conf[start..i])?;
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&conf[start..])?;
    if depth != 0 {
        return err(format!("allocator settings {conf:?}: unbalanced brackets"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_conf_string() {
        let s = Settings::parse(
            "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert!(s.expandable_segments);
        assert_eq!(s.max_split_size, 128 << 20);
        assert_eq!(s.garbage_collection_threshold, 0.6);
        assert_eq!(
            s.label(),
            "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6"
        );
        assert_eq!(Settings::default().label(), "default");
    }

    #[test]
    fn refuses_what_pytorch_refuses() {
        assert!(Settings::parse("max_split_size_mb:10").is_err());
        assert!(Settings::parse("garbage_collection_threshold:1.5").is_err());
        assert!(Settings::parse("roundup_power2_divisions:3").is_err());
        assert!(Settings::parse("roundup_power2_divisions:[256:3]").is_err());
        assert!(Settings::parse("expandable_segments:maybe").is_err());
        assert!(Settings::parse("no_such_thing:1").is_err());
        assert!(Settings::parse("max_split_size_mb").is_err());
    }

    #[test]
    fn per_interval_divisions_fill_as_pytorch_does() {
        let s = Settings::parse("roundup_power2_divisions:[4:2,64:8,>:1]").unwrap();
        let t = s.roundup_power2_divisions;
        // The first entry fills the intervals below it; `>` fills from the last one named.
        assert_eq!(&t[..3], &[2, 2, 2]);
        assert_eq!(t[3], 0);
        assert_eq!(t[6], 1);
        assert_eq!(&t[7..], &[1; 9]);
        assert_eq!(s.divisions_for(5 << 20), 2);
        assert_eq!(s.divisions_for(100), 2);
        assert_eq!(s.divisions_for(10 << 20), 0);
    }

    #[test]
    fn reads_recorded_settings() {
        let pairs = vec![
            (
                "PYTORCH_CUDA_ALLOC_CONF".to_string(),
                "max_non_split_rounding_mb:64".to_string(),
            ),
            ("max_split_size".to_string(), "-1".to_string()),
            (
                "garbage_collection_threshold".to_string(),
                "0.0".to_string(),
            ),
            ("expandable_segments".to_string(), "True".to_string()),
            (
                "roundup_power2_divisions".to_string(),
                "{'1': 4, '2': 4, '4': 0}".to_string(),
            ),
        ];
        let s = Settings::from_recorded(&pairs).unwrap();
        assert!(s.expandable_segments);
        assert_eq!(s.max_split_size, u64::MAX);
        assert_eq!(s.max_non_split_rounding, 64 << 20);
        assert_eq!(&s.roundup_power2_divisions[..3], &[4, 4, 0]);
    }
}
