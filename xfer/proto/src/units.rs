//! Human-readable byte counts and rates (binary units: KiB, MiB/s), and
//! parsing of sizes like `4MiB`.

use std::fmt;

/// Formats a byte count with binary units: `1.5 GiB`.
#[derive(Clone, Copy, Debug)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.1} {}", UNITS[u])
        }
    }
}

/// Formats a rate in bytes per second with the same binary units as
/// [`Bytes`]: `20.1 MiB/s`.
#[derive(Clone, Copy, Debug)]
pub struct Rate(pub f64);

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = if self.0.is_finite() {
            self.0.max(0.0)
        } else {
            0.0
        };
        write!(f, "{}/s", Bytes(r as u64))
    }
}

/// Text that is not a size ([`parse_size`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// The number part does not parse.
    #[error("`{0}` is not a size; write e.g. 4MiB, 512M or 2GiB")]
    NotANumber(String),
    /// The unit is none of the known ones.
    #[error("unknown unit in `{0}`; use B, KiB, MiB, GiB or TiB")]
    UnknownUnit(String),
}

/// Parses `123`, `4k`, `4KiB`, `1.5G`, `512MB`... Decimal (`KB`, `MB`) and
/// binary (`K`, `KiB`, `M`, `MiB`) suffixes are both accepted; a bare letter
/// means binary.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| SizeError::NotANumber(s.to_string()))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0f64.powi(3),
        "gb" => 1e9,
        "t" | "tib" => 1024.0f64.powi(4),
        "tb" => 1e12,
        _ => return Err(SizeError::UnknownUnit(s.to_string())),
    };
    Ok((n * mult).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("4m").unwrap(), 4 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert_eq!(parse_size("77").unwrap(), 77);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(Bytes(12).to_string(), "12 B");
        assert_eq!(Rate(20.1 * 1048576.0).to_string(), "20.1 MiB/s");
        assert_eq!(Rate(f64::NAN).to_string(), "0 B/s");
    }
}
