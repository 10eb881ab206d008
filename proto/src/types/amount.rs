//! Fixed-point resource amounts and capacities.
//!
//! An [`Amount`] counts a resource in units of 1/10,000 (Ray's 0.0001 precision), stored as a
//! `u64`, so the scheduler never compares floats. Amounts are never negative and never larger
//! than [`Amount::MAX`] (10^14 units): anything larger is rejected as absurd, which also leaves
//! headroom so that adding any two valid amounts cannot overflow.
//!
//! A [`Capacity`] is what a node has of a resource: a finite amount or [`Capacity::Unbounded`]
//! (the thesis' "infinite" locality resources, P1).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::TypeError;

/// Fractions per unit: an amount of `1` is stored as `10_000`.
pub const SCALE: u64 = 10_000;

/// The largest number of whole units an amount may hold.
const MAX_UNITS: u64 = 100_000_000_000_000;

/// A non-negative fixed-point quantity of a resource, with 0.0001 precision.
///
/// Serialized as its raw `u64` in binary formats (bincode) and as a decimal string (`"0.5"`)
/// in human-readable ones (JSON), so scripts read the same text the CLI prints.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Amount(u64);

impl Amount {
    /// No resource at all.
    pub const ZERO: Amount = Amount(0);
    /// One whole unit.
    pub const ONE: Amount = Amount(SCALE);
    /// The smallest non-zero amount, 0.0001.
    pub const EPSILON: Amount = Amount(1);
    /// The largest valid amount, 10^14 units.
    pub const MAX: Amount = Amount(MAX_UNITS * SCALE);

    /// `units` whole units. Fails above [`Amount::MAX`].
    pub fn units(units: u64) -> Result<Amount, TypeError> {
        units
            .checked_mul(SCALE)
            .map(Amount)
            .filter(|a| *a <= Amount::MAX)
            .ok_or_else(|| TypeError::InvalidAmount {
                text: units.to_string(),
                why: "larger than the maximum of 10^14 units",
            })
    }

    /// An amount from its raw count of 1/10,000 units. Fails above [`Amount::MAX`].
    pub fn from_raw(raw: u64) -> Result<Amount, TypeError> {
        if raw > Amount::MAX.0 {
            return Err(TypeError::InvalidAmount {
                text: format!("{raw} (raw)"),
                why: "larger than the maximum of 10^14 units",
            });
        }
        Ok(Amount(raw))
    }

    /// The raw count of 1/10,000 units.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Whether this is zero.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self + other`, or an error if the sum exceeds [`Amount::MAX`].
    pub fn checked_add(self, other: Amount) -> Result<Amount, TypeError> {
        // Both are at most MAX, and 2 * MAX fits in a u64, so the addition itself cannot wrap.
        let sum = Amount(self.0 + other.0);
        if sum > Amount::MAX {
            return Err(TypeError::Arithmetic(
                "sum exceeds the maximum of 10^14 units",
            ));
        }
        Ok(sum)
    }

    /// `self - other`, or an error if the result would be negative.
    pub fn checked_sub(self, other: Amount) -> Result<Amount, TypeError> {
        self.0
            .checked_sub(other.0)
            .map(Amount)
            .ok_or(TypeError::Arithmetic("difference would be negative"))
    }

    /// `self - other`, or zero if `other` is larger.
    pub const fn saturating_sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// This amount as a float, for display and utilisation figures only (never for matching).
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / SCALE as f64
    }
}

impl TryFrom<u64> for Amount {
    type Error = TypeError;
    fn try_from(raw: u64) -> Result<Self, Self::Error> {
        Amount::from_raw(raw)
    }
}

impl From<Amount> for u64 {
    fn from(a: Amount) -> u64 {
        a.0
    }
}

impl FromStr for Amount {
    type Err = TypeError;

    /// Parses `2`, `0.5`, `.5`, `0.0001`, `1_000`. No sign, exponent, NaN or infinity.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why| TypeError::InvalidAmount {
            text: text.to_string(),
            why,
        };
        let s = text.trim();
        if s.is_empty() {
            return Err(bad("empty; write a number such as 2 or 0.5"));
        }
        if s.starts_with('-') {
            return Err(bad("amounts cannot be negative"));
        }
        let lower = s.to_ascii_lowercase();
        if lower.contains("nan") || lower.contains("inf") {
            return Err(bad("not a finite number; write a number such as 2 or 0.5"));
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let (int_part, frac_part) = match s.split_once('.') {
            Some((i, f)) => (i, f),
            None => (s, ""),
        };
        let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit() || b == b'_');
        if !digits(int_part) || !digits(frac_part) || (int_part.is_empty() && frac_part.is_empty())
        {
            return Err(bad("not a decimal number; write a number such as 2 or 0.5"));
        }
        let int_digits: String = int_part.chars().filter(|c| *c != '_').collect();
        let frac_digits: String = frac_part.chars().filter(|c| *c != '_').collect();
        let frac_trimmed = frac_digits.trim_end_matches('0');
        if frac_trimmed.len() > 4 {
            return Err(bad("finer than the 0.0001 precision of amounts"));
        }
        let int_digits = int_digits.trim_start_matches('0');
        if int_digits.len() > 15 {
            return Err(bad("larger than the maximum of 10^14 units"));
        }
        let whole: u64 = if int_digits.is_empty() {
            0
        } else {
            int_digits
                .parse()
                .map_err(|_| bad("not a decimal number"))?
        };
        let mut frac: u64 = 0;
        for (i, b) in frac_trimmed.bytes().enumerate() {
            frac += u64::from(b - b'0') * 10u64.pow(3 - i as u32);
        }
        let raw = whole * SCALE + frac;
        if raw > Amount::MAX.0 {
            return Err(bad("larger than the maximum of 10^14 units"));
        }
        Ok(Amount(raw))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / SCALE;
        let frac = self.0 % SCALE;
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:04}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

impl fmt::Debug for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// How much of a resource a node has: a finite amount, or unbounded.
///
/// Serialized as an enum in binary formats and as text (`"4"`, `"unbounded"`) in
/// human-readable ones.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capacity {
    /// At most this much can be allocated at once.
    Finite(Amount),
    /// Any number of tasks may hold any amount; used for locality markers (P1).
    Unbounded,
}

impl Capacity {
    /// Whether `amount` can be taken from this capacity when `used` is already taken.
    pub fn admits(self, used: Amount, amount: Amount) -> bool {
        match self {
            Capacity::Unbounded => true,
            Capacity::Finite(total) => total.saturating_sub(used) >= amount,
        }
    }

    /// Whether this capacity could ever hold `amount` (on an otherwise idle node).
    pub fn could_hold(self, amount: Amount) -> bool {
        self.admits(Amount::ZERO, amount)
    }

    /// Whether this is a finite zero, which as a set value means "delete".
    pub fn is_zero(self) -> bool {
        self == Capacity::Finite(Amount::ZERO)
    }

    /// What remains when `used` is taken: `None` for unbounded.
    pub fn available(self, used: Amount) -> Option<Amount> {
        match self {
            Capacity::Unbounded => None,
            Capacity::Finite(total) => Some(total.saturating_sub(used)),
        }
    }
}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u64(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            text.parse().map_err(de::Error::custom)
        } else {
            Amount::from_raw(u64::deserialize(deserializer)?).map_err(de::Error::custom)
        }
    }
}

/// The binary form of [`Capacity`].
#[derive(Serialize, Deserialize)]
enum CapacityRepr {
    Finite(Amount),
    Unbounded,
}

impl Serialize for Capacity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return serializer.collect_str(self);
        }
        match *self {
            Capacity::Finite(a) => CapacityRepr::Finite(a),
            Capacity::Unbounded => CapacityRepr::Unbounded,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Capacity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            return text.parse().map_err(de::Error::custom);
        }
        Ok(match CapacityRepr::deserialize(deserializer)? {
            CapacityRepr::Finite(a) => Capacity::Finite(a),
            CapacityRepr::Unbounded => Capacity::Unbounded,
        })
    }
}

impl From<Amount> for Capacity {
    fn from(a: Amount) -> Self {
        Capacity::Finite(a)
    }
}

impl FromStr for Capacity {
    type Err = TypeError;

    /// Parses an amount, or `unbounded` / `inf` / `infinite` for [`Capacity::Unbounded`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "unbounded" | "inf" | "infinite" | "infinity" => Ok(Capacity::Unbounded),
            _ => s.parse().map(Capacity::Finite),
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capacity::Finite(a) => a.fmt(f),
            Capacity::Unbounded => f.write_str("unbounded"),
        }
    }
}

impl fmt::Debug for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Amount {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_prints_round_values() {
        for (text, raw, shown) in [
            ("2", 20_000, "2"),
            ("0.5", 5_000, "0.5"),
            (".5", 5_000, "0.5"),
            ("0.0001", 1, "0.0001"),
            ("1.2500", 12_500, "1.25"),
            ("0", 0, "0"),
            ("1_000", 10_000_000, "1000"),
            (" 3 ", 30_000, "3"),
        ] {
            let amount = a(text);
            assert_eq!(amount.raw(), raw, "{text}");
            assert_eq!(amount.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn rejects_malformed_amounts_with_reasons() {
        for (text, why) in [
            ("-1", "negative"),
            ("NaN", "finite"),
            ("inf", "finite"),
            ("0.00001", "precision"),
            ("1e3", "decimal"),
            ("", "empty"),
            (".", "decimal"),
            ("1.2.3", "decimal"),
            ("100000000000001", "maximum"),
            ("99999999999999999999999", "maximum"),
        ] {
            let err = text.parse::<Amount>().unwrap_err().to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn maximum_is_accepted_and_one_more_is_not() {
        assert_eq!(a("100000000000000"), Amount::MAX);
        assert!(Amount::from_raw(Amount::MAX.raw() + 1).is_err());
        assert!(Amount::units(100_000_000_000_000).is_ok());
        assert!(Amount::units(100_000_000_000_001).is_err());
        assert!(Amount::units(u64::MAX).is_err());
    }

    #[test]
    fn checked_arithmetic_reports_overflow_and_underflow() {
        assert_eq!(a("1.5").checked_add(a("0.5")).unwrap(), a("2"));
        assert!(Amount::MAX.checked_add(Amount::EPSILON).is_err());
        assert!(a("1").checked_sub(a("1.0001")).is_err());
        assert_eq!(a("1").saturating_sub(a("3")), Amount::ZERO);
    }

    #[test]
    fn capacity_admission() {
        let c = Capacity::Finite(a("2"));
        assert!(c.admits(a("1"), a("1")));
        assert!(!c.admits(a("1.5"), a("1")));
        assert!(
            !c.admits(a("3"), Amount::EPSILON),
            "shortfall admits nothing"
        );
        assert!(Capacity::Unbounded.admits(Amount::MAX, Amount::MAX));
        assert_eq!(
            "unbounded".parse::<Capacity>().unwrap(),
            Capacity::Unbounded
        );
        assert_eq!(
            "0.5".parse::<Capacity>().unwrap(),
            Capacity::Finite(a("0.5"))
        );
        assert!("-2".parse::<Capacity>().is_err());
    }

    #[test]
    fn json_uses_the_text_the_cli_prints() {
        let json =
            serde_json::to_string(&(a("2.5"), Capacity::Unbounded, Capacity::Finite(a("4"))))
                .unwrap();
        assert_eq!(json, r#"["2.5","unbounded","4"]"#);
        let back: (Amount, Capacity, Capacity) = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back,
            (a("2.5"), Capacity::Unbounded, Capacity::Finite(a("4")))
        );
        assert!(serde_json::from_str::<Amount>(r#""-1""#).is_err());
    }

    #[test]
    fn serde_rejects_out_of_range_raw_values() {
        let cfg = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(u64::MAX, cfg).unwrap();
        let back: Result<(Amount, usize), _> = bincode::serde::decode_from_slice(&bytes, cfg);
        assert!(back.is_err());
        let bytes = bincode::serde::encode_to_vec(a("2.5"), cfg).unwrap();
        let (back, _): (Amount, usize) = bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
        assert_eq!(back, a("2.5"));
    }

    proptest::proptest! {
        #[test]
        fn display_then_parse_is_identity(raw in 0..=Amount::MAX.raw()) {
            let amount = Amount::from_raw(raw).unwrap();
            proptest::prop_assert_eq!(amount.to_string().parse::<Amount>().unwrap(), amount);
        }
    }
}
