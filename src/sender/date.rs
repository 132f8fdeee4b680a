//! A response's `Date` header as a version, for kinds whose items carry none.

/// A response's `Date` (RFC 9110 IMF-fixdate, whole seconds) in microseconds, the unit
/// of timestamp versions.
pub fn response_date(value: Option<&str>) -> Result<i64, String> {
    const NEEDED: &str = "the kind has version_from = \"response_date\", so every list and get response must carry it";
    let text = value.ok_or_else(|| format!("no Date header; {NEEDED}"))?;
    let t = chrono::DateTime::parse_from_rfc2822(text.trim())
        .map_err(|e| format!("Date header {text:?} is not an HTTP date ({e}); {NEEDED}"))?;
    let micros = t.timestamp_micros();
    if micros < 0 {
        return Err(format!("Date header {text:?} is before 1970"));
    }
    Ok(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_date_is_whole_seconds_in_microseconds_and_its_absence_is_explained() {
        assert_eq!(
            response_date(Some("Sun, 06 Nov 1994 08:49:37 GMT")),
            Ok(784_111_777_000_000)
        );
        let missing = response_date(None).unwrap_err();
        assert!(
            missing.contains("no Date header") && missing.contains("response_date"),
            "{missing}"
        );
        let garbage = response_date(Some("yesterday")).unwrap_err();
        assert!(
            garbage.contains("\"yesterday\" is not an HTTP date"),
            "{garbage}"
        );
        assert!(response_date(Some("Thu, 01 Jan 1900 00:00:00 GMT")).is_err());
    }
}
