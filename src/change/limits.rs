//! Input limits, checked before anything reaches the database and identical on both
//! backends (SPEC "Input limits"): what PostgreSQL would refuse, SQLite refuses too, so a
//! delivery gets the same answer whichever backend runs, and no refusal can look like an
//! outage. Pure.

use serde_json::Value;

use super::scan::{Json, Text};

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
        Value::String(s) if s.contains('\0') => Err(NUL_IN_STRING.into()),
        // The number's text as the sender wrote it (arbitrary_precision): no copy.
        Value::Number(n) => check_number(n.as_str()),
        Value::Array(items) => items.iter().try_for_each(check_state),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            if k.contains('\0') {
                Err(NUL_IN_KEY.into())
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

/// A number's parts: sign, the digits (integer then fraction), how many of them stand
/// before the point (may be below 0 or past the end), and PostgreSQL's display scale.
struct Decimal<'a> {
    negative: bool,
    int: &'a str,
    frac: &'a str,
    point: i64,
    scale: i64,
}

impl<'a> Decimal<'a> {
    /// `text` is a JSON number already within [`check_number`]'s range.
    fn parse(text: &'a str) -> Decimal<'a> {
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(u) => (true, u),
            None => (false, text),
        };
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(i) => (
                &unsigned[..i],
                unsigned[i + 1..].parse::<i64>().unwrap_or(0),
            ),
            None => (unsigned, 0),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        Decimal {
            negative,
            int,
            frac,
            point: int.len() as i64 + exponent,
            scale: (frac.len() as i64 - exponent).max(0),
        }
    }

    fn digit(&self, i: i64) -> u8 {
        let (int, frac) = (self.int.as_bytes(), self.frac.as_bytes());
        match usize::try_from(i) {
            Ok(i) if i < int.len() => int[i],
            Ok(i) if i - int.len() < frac.len() => frac[i - int.len()],
            _ => b'0',
        }
    }

    fn len(&self) -> i64 {
        (self.int.len() + self.frac.len()) as i64
    }

    /// The first significant digit's index, if any digit is not 0.
    fn first_significant(&self) -> Option<i64> {
        (0..self.len()).find(|i| self.digit(*i) != b'0')
    }

    /// Bytes of the text PostgreSQL prints.
    fn written_len(&self) -> i64 {
        let first = self.first_significant();
        let int_digits = match first {
            Some(f) if f < self.point => self.point - f,
            _ => 1,
        };
        let sign = i64::from(self.negative && first.is_some());
        let fraction = if self.scale > 0 { 1 + self.scale } else { 0 };
        sign + int_digits + fraction
    }

    fn write(&self, out: &mut Vec<u8>) {
        let first = self.first_significant();
        if self.negative && first.is_some() {
            out.push(b'-');
        }
        match first {
            Some(f) if f < self.point => out.extend((f..self.point).map(|i| self.digit(i))),
            _ => out.push(b'0'),
        }
        if self.scale > 0 {
            out.push(b'.');
            out.extend((self.point..self.point + self.scale).map(|i| self.digit(i)));
        }
    }
}

/// Whether a number's text is already as PostgreSQL prints it: no exponent, and not a
/// negative zero. JSON has no other leading zeros, so that is the common case.
fn printed_as_is(text: &str) -> bool {
    let negative_zero =
        text.starts_with('-') && text.bytes().all(|b| matches!(b, b'-' | b'0' | b'.'));
    !(text.contains(['e', 'E']) || negative_zero)
}

/// A number as PostgreSQL prints it (`1e3` -> `1000`, `1.0E+2` -> `100`, `-0.0` -> `0.0`).
/// SQLite keeps the text we give it; giving it this text makes both backends hold and
/// return the same JSON, and the size checked the size stored.
pub fn plain_decimal(text: &str) -> std::borrow::Cow<'_, str> {
    if printed_as_is(text) {
        return text.into();
    }
    let mut out = Vec::new();
    Decimal::parse(text).write(&mut out);
    String::from_utf8_lossy(&out).into_owned().into()
}

/// A state as canonical JSON (keys in order, no whitespace, numbers as PostgreSQL
/// prints them), refused when NUL is in it, a number is out of `numeric`'s range, or
/// the text written out would be longer than `max_bytes`: one signed `1e131071` is
/// 131,072 bytes once written, and a few thousand of them would expand a small
/// delivery into what no feed read can carry.
pub fn canonical_state(v: &Value, max_bytes: usize) -> Result<String, String> {
    check_state(v)?;
    let mut out = Vec::with_capacity(256);
    write_canonical(v, &mut out, i64::try_from(max_bytes).unwrap_or(i64::MAX))?;
    // Only JSON text was written: the escaped strings and ASCII around them.
    String::from_utf8(out).map_err(|e| format!("not UTF-8 once written: {e}"))
}

fn write_canonical(v: &Value, out: &mut Vec<u8>, max: i64) -> Result<(), String> {
    match v {
        Value::Number(n) => write_number(n.as_str(), out, max)?,
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out, max)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).map_err(|e| e.to_string())?;
                out.push(b':');
                write_canonical(item, out, max)?;
            }
            out.push(b'}');
        }
        other => serde_json::to_writer(&mut *out, other).map_err(|e| e.to_string())?,
    }
    if out.len() as i64 > max {
        return Err(too_large(max, out.len() as i64));
    }
    Ok(())
}

fn too_large(max: i64, at_least: i64) -> String {
    format!(
        "written out it is more than {max} bytes (at least {at_least}; numbers count as PostgreSQL prints them), over http.max_body"
    )
}

/// A number as PostgreSQL prints it, refused before it is written when the text would
/// pass `max` (one `1e131071` is 131,072 bytes).
fn write_number(text: &str, out: &mut Vec<u8>, max: i64) -> Result<(), String> {
    if printed_as_is(text) {
        out.extend_from_slice(text.as_bytes());
    } else {
        let d = Decimal::parse(text);
        let needed = out.len() as i64 + d.written_len();
        if needed > max {
            return Err(too_large(max, needed));
        }
        d.write(out);
    }
    Ok(())
}

const NUL_IN_STRING: &str = "it contains a NUL character (\\u0000), which cannot be stored";
const NUL_IN_KEY: &str = "a key contains a NUL character (\\u0000), which cannot be stored";

/// [`canonical_state`] of a state read by `scan`: the same text and the same refusals,
/// in one walk (checked as it is written) that copies unescaped strings and numbers
/// from the item's text instead of escaping them again.
pub fn canonical_text(v: &Json<'_>, max_bytes: usize) -> Result<String, String> {
    let mut out = Vec::with_capacity(256);
    write_text(v, &mut out, i64::try_from(max_bytes).unwrap_or(i64::MAX))?;
    // Only JSON text was written: the item's own UTF-8, escaped strings and ASCII.
    String::from_utf8(out).map_err(|e| format!("not UTF-8 once written: {e}"))
}

fn write_string(s: &Text<'_>, out: &mut Vec<u8>, nul: &str) -> Result<(), String> {
    match s.verbatim() {
        Some(raw) => {
            out.push(b'"');
            out.extend_from_slice(raw.as_bytes());
            out.push(b'"');
        }
        None => {
            // Only an escape can put a NUL in a string: an unescaped one is not JSON.
            if s.as_str().contains('\0') {
                return Err(nul.into());
            }
            serde_json::to_writer(&mut *out, s.as_str()).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn write_text(v: &Json<'_>, out: &mut Vec<u8>, max: i64) -> Result<(), String> {
    match v {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(text) => {
            check_number(text)?;
            write_number(text, out, max)?;
        }
        Json::String(s) => write_string(s, out, NUL_IN_STRING)?,
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_text(item, out, max)?;
            }
            out.push(b']');
        }
        Json::Object(entries) => {
            out.push(b'{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out, NUL_IN_KEY)?;
                out.push(b':');
                write_text(item, out, max)?;
            }
            out.push(b'}');
        }
    }
    if out.len() as i64 > max {
        return Err(too_large(max, out.len() as i64));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_written_as_postgresql_prints_them() {
        // Each pair checked against PostgreSQL 15: `SELECT '[..]'::jsonb`.
        for (given, printed) in [
            ("-0", "0"),
            ("-0.0", "0.0"),
            ("-0.00", "0.00"),
            ("1.0E+2", "100"),
            ("1.23e1", "12.3"),
            ("12e-1", "1.2"),
            ("0.000e5", "0"),
            ("1.50", "1.50"),
            ("-1.5e-3", "-0.0015"),
            ("1E0", "1"),
            ("0e-2", "0.00"),
            ("100e-2", "1.00"),
            ("-12.340e1", "-123.40"),
            ("1e2", "100"),
            ("42", "42"),
            ("-7.25", "-7.25"),
        ] {
            assert_eq!(plain_decimal(given), printed, "{given}");
            assert_eq!(
                Decimal::parse(given).written_len(),
                printed.len() as i64,
                "{given}"
            );
        }
        assert_eq!(Decimal::parse("1e131071").written_len(), 131_072);
    }

    #[test]
    fn a_state_is_judged_written_out() {
        let bomb: Value =
            serde_json::from_str(&format!("[{}]", vec!["1e131071"; 1000].join(","))).unwrap();
        let err = canonical_state(&bomb, 1 << 20).unwrap_err();
        assert!(err.contains("http.max_body"), "{err}");
        let ok: Value = serde_json::from_str(r#"{"b":1e3,"a":[-0.0,"x"]}"#).unwrap();
        assert_eq!(
            canonical_state(&ok, 100).unwrap(),
            r#"{"a":[0.0,"x"],"b":1000}"#
        );
        assert!(canonical_state(&ok, 10).is_err());
    }

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
