//! Input limits, checked before anything reaches the database and identical on both
//! backends (SPEC "Input limits"): what PostgreSQL would refuse, SQLite refuses too, so a
//! delivery gets the same answer whichever backend runs, and no refusal can look like an
//! outage. Pure.

use serde_json::Value;

/// Longest event or resource id, in bytes of UTF-8: well inside PostgreSQL's btree row
/// limit (about 2.7 kB) for the primary keys that hold ids.
pub const MAX_ID_BYTES: usize = 1024;
/// PostgreSQL's `numeric` (JSONB numbers): at most this many digits before the point...
pub const MAX_INTEGER_DIGITS: i64 = 131_072;
/// ...and at most this many after it (its display scale).
pub const MAX_FRACTION_DIGITS: i64 = 16_383;

/// An id: non-empty, at most [`MAX_ID_BYTES`] bytes, no NUL.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        Err("it is empty".into())
    } else if id.len() > MAX_ID_BYTES {
        Err(format!(
            "it is {} bytes long; at most {MAX_ID_BYTES} bytes are accepted",
            id.len()
        ))
    } else if id.contains('\0') {
        Err("it contains a NUL character".into())
    } else {
        Ok(())
    }
}

/// A state document: no NUL in any string or key (PostgreSQL stores neither in TEXT nor
/// JSONB) and every number within PostgreSQL's `numeric` range.
pub fn check_state(v: &Value) -> Result<(), String> {
    match v {
        Value::String(s) if s.contains('\0') => {
            Err("it contains a NUL character (\\u0000), which cannot be stored".into())
        }
        // The number's text as the sender wrote it (arbitrary_precision): no copy.
        Value::Number(n) => check_number(n.as_str()),
        Value::Array(items) => items.iter().try_for_each(check_state),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            if k.contains('\0') {
                Err("a key contains a NUL character (\\u0000), which cannot be stored".into())
            } else {
                check_state(v)
            }
        }),
        _ => Ok(()),
    }
}

/// A JSON number's text within PostgreSQL's `numeric` range: at most
/// [`MAX_INTEGER_DIGITS`] digits before the point and [`MAX_FRACTION_DIGITS`] after it,
/// counted as PostgreSQL counts them (`1e131072` and `1.5e-16383` are out).
pub fn check_number(text: &str) -> Result<(), String> {
    let out_of_range = || {
        let shown: String = text.chars().take(40).collect();
        let more = if text.len() > 40 { "..." } else { "" };
        format!(
            "the number {shown}{more} is outside the range a database can store \
             ({MAX_INTEGER_DIGITS} digits before the point, {MAX_FRACTION_DIGITS} after)"
        )
    };
    // Without an exponent a number has no more digits on either side of the point than
    // characters: the common case needs no counting (and no allocation).
    if text.len() <= MAX_FRACTION_DIGITS as usize && !text.contains(['e', 'E']) {
        return Ok(());
    }
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => {
            let e = &unsigned[i + 1..];
            // Beyond 9 digits the exponent alone is out of range.
            let digits = e.trim_start_matches(['+', '-']).trim_start_matches('0');
            if digits.len() > 9 {
                return Err(out_of_range());
            }
            let exp: i64 = e.parse().map_err(|_| out_of_range())?;
            (&unsigned[..i], exp)
        }
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let scale = (frac.len() as i64 - exponent).max(0);
    if scale > MAX_FRACTION_DIGITS {
        return Err(out_of_range());
    }
    let digits = format!("{int}{frac}");
    if let Some(first) = digits.find(|c: char| c != '0') {
        // Digits before the point, counted from the first significant one.
        let before_point = int.len() as i64 + exponent - first as i64;
        if before_point > MAX_INTEGER_DIGITS {
            return Err(out_of_range());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_refused_exactly_where_postgresql_refuses_them() {
        // Each case checked against PostgreSQL 15: `SELECT 'N'::jsonb`.
        for ok in [
            "0",
            "-12.50",
            "1e1000",
            "1e131071",
            "1e-16383",
            "0e1000000",
            "123456789012345678901234567890.10",
            "1E+5",
            "0.000",
        ] {
            assert_eq!(check_number(ok), Ok(()), "{ok}");
        }
        for bad in [
            "1e131072",
            "1e-16384",
            "0.0e-20000",
            "1.5e-16383",
            "1e1000000",
            "1e99999999999999999999",
        ] {
            assert!(check_number(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_are_non_empty_short_and_free_of_nul() {
        assert!(check_id("ord_1").is_ok());
        assert!(check_id(&"x".repeat(MAX_ID_BYTES)).is_ok());
        assert!(check_id(&"x".repeat(MAX_ID_BYTES + 1)).is_err());
        // Bytes, not characters: 342 × 3-byte characters = 1026 bytes.
        assert!(check_id(&"€".repeat(342)).is_err());
        assert!(check_id("").is_err());
        assert!(check_id("a\0b").is_err());
    }
}
