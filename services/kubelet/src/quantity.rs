//! Kubernetes resource quantities (`100m`, `2`, `1.5Gi`, `128974848`, `129e6`) as integers:
//! CPU in millicores, everything else in whole units (bytes for memory), rounded up as the
//! kubelet rounds them.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid quantity {0:?}")]
pub struct InvalidQuantity(pub String);

/// The quantity scaled by `scale` (1000 for millicores, 1 for bytes), rounded up; `None` when
/// it does not fit in an i64.
fn scaled(text: &str, scale: i128) -> Result<i128, InvalidQuantity> {
    let bad = || InvalidQuantity(text.to_owned());
    let text = text.trim();
    let split =
        text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    // numerator / denominator of the multiplier
    let (mul, div): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().map_err(|_| bad())?;
            (10i128.checked_pow(exp).ok_or_else(bad)?, 1)
        }
        _ => return Err(bad()),
    };
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && frac.is_empty() || !whole.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    if frac.len() > 18 || whole.len() > 30 {
        return Err(bad());
    }
    let frac_scale = 10i128.pow(u32::try_from(frac.len()).map_err(|_| bad())?);
    let whole: i128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad())? };
    let frac: i128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| bad())? };
    let numerator = (whole.checked_mul(frac_scale).and_then(|w| w.checked_add(frac)))
        .and_then(|n| n.checked_mul(mul))
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(bad)?;
    let denominator = div.checked_mul(frac_scale).ok_or_else(bad)?;
    let value = (numerator + denominator - 1) / denominator;
    Ok(if negative { -value } else { value })
}

fn to_i64(text: &str, value: i128) -> Result<i64, InvalidQuantity> {
    i64::try_from(value).map_err(|_| InvalidQuantity(text.to_owned()))
}

/// CPU in millicores (`500m` → 500, `2` → 2000).
pub fn millicores(q: &Quantity) -> Result<i64, InvalidQuantity> {
    to_i64(&q.0, scaled(&q.0, 1000)?)
}

/// A whole-unit quantity: bytes for memory and storage, a count for everything else.
pub fn units(q: &Quantity) -> Result<i64, InvalidQuantity> {
    to_i64(&q.0, scaled(&q.0, 1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    #[test]
    fn parses_what_kubectl_accepts() {
        assert_eq!(millicores(&q("100m")), Ok(100));
        assert_eq!(millicores(&q("2")), Ok(2000));
        assert_eq!(millicores(&q("0.5")), Ok(500));
        assert_eq!(millicores(&q("1.0001")), Ok(1001), "rounded up");
        assert_eq!(units(&q("1Gi")), Ok(1 << 30));
        assert_eq!(units(&q("1.5Gi")), Ok(3 << 29));
        assert_eq!(units(&q("128974848")), Ok(128_974_848));
        assert_eq!(units(&q("129e6")), Ok(129_000_000));
        assert_eq!(units(&q("129M")), Ok(129_000_000));
        assert_eq!(units(&q("1k")), Ok(1000));
    }

    #[test]
    fn refuses_nonsense_and_overflow() {
        for bad in ["", "abc", "1x", "1..2", "Gi", "1e999", "99999999999999999999999Ei", "1.2.3"] {
            assert!(units(&q(bad)).is_err(), "{bad}");
        }
        assert!(millicores(&q("100000000000000000")).is_err(), "overflows i64 millicores");
    }
}
