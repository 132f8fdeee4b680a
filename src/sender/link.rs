//! RFC 8288 `Link` headers: the `rel="next"` target. Pure.
//!
//! Written by hand (a small state machine) because the crates we looked at split on
//! commas before reading the `<...>` target; a URI may contain commas and semicolons
//! (`<https://api/x?fields=id,version>`), which must never end a sweep early.
//!
//! Grammar (RFC 8288 section 3): `link-value = "<" URI-Reference ">" *( OWS ";" OWS link-param )`,
//! several link-values separated by commas, several headers equivalent to one joined
//! with commas; `link-param = token BWS [ "=" BWS ( token / quoted-string ) ]`; the `rel`
//! value is a space-separated list of relation types, compared case-insensitively.

/// One link: its target and parameters (names lower-cased, values unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub target: String,
    pub params: Vec<(String, String)>,
}

impl Link {
    /// The relation types of this link (`rel="next last"` -> next, last), lower-cased.
    pub fn rels(&self) -> impl Iterator<Item = String> + '_ {
        self.params
            .iter()
            .filter(|(k, _)| k == "rel")
            // RFC 8288 3.3: occurrences after the first are ignored.
            .take(1)
            .flat_map(|(_, v)| v.split_ascii_whitespace().map(str::to_ascii_lowercase))
    }
}

/// Why a `Link` header could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Link header is malformed at byte {at}: {reason}")]
pub struct LinkError {
    pub at: usize,
    pub reason: &'static str,
}

/// Parses every link of the given header values (several `Link` headers allowed).
pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<Vec<Link>, LinkError> {
    let mut links = Vec::new();
    for value in values {
        parse_one(value, &mut links)?;
    }
    Ok(links)
}

/// The `rel="next"` target among the header values, if any. Two different next targets
/// are an error: following either could skip pages.
pub fn next_target<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> Result<Option<String>, LinkError> {
    let mut next: Option<String> = None;
    for link in parse(values)? {
        if link.rels().any(|r| r == "next") {
            match &next {
                Some(t) if *t != link.target => {
                    return Err(LinkError {
                        at: 0,
                        reason: "two different rel=\"next\" targets",
                    });
                }
                _ => next = Some(link.target),
            }
        }
    }
    Ok(next)
}

fn parse_one(s: &str, out: &mut Vec<Link>) -> Result<(), LinkError> {
    let b = s.as_bytes();
    let mut i = 0;
    let err = |at: usize, reason: &'static str| LinkError { at, reason };
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t') {
            *i += 1;
        }
    };
    loop {
        // Empty elements between commas are allowed (RFC 9110 list rule).
        skip_ws(&mut i);
        while i < b.len() && b[i] == b',' {
            i += 1;
            skip_ws(&mut i);
        }
        if i >= b.len() {
            return Ok(());
        }
        if b[i] != b'<' {
            return Err(err(i, "expected '<' starting a link target"));
        }
        let start = i + 1;
        let end = s[start..]
            .find('>')
            .map(|n| start + n)
            .ok_or_else(|| err(i, "unterminated '<' target"))?;
        let target = s[start..end].trim().to_string();
        i = end + 1;
        let mut params = Vec::new();
        loop {
            skip_ws(&mut i);
            if i >= b.len() || b[i] == b',' {
                break;
            }
            if b[i] != b';' {
                return Err(err(i, "expected ';' or ',' after a link"));
            }
            i += 1;
            skip_ws(&mut i);
            let name_start = i;
            while i < b.len() && is_token_char(b[i]) {
                i += 1;
            }
            if i == name_start {
                return Err(err(i, "expected a parameter name"));
            }
            let name = s[name_start..i].to_ascii_lowercase();
            skip_ws(&mut i);
            let mut value = String::new();
            if i < b.len() && b[i] == b'=' {
                i += 1;
                skip_ws(&mut i);
                if i < b.len() && b[i] == b'"' {
                    i += 1;
                    let mut closed = false;
                    while i < b.len() {
                        match b[i] {
                            b'\\' if i + 1 < b.len() => {
                                value.push(char::from(b[i + 1]));
                                i += 2;
                            }
                            b'"' => {
                                i += 1;
                                closed = true;
                                break;
                            }
                            _ => {
                                // Copy one whole UTF-8 character.
                                let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
                                value.push(ch);
                                i += ch.len_utf8();
                            }
                        }
                    }
                    if !closed {
                        return Err(err(i, "unterminated quoted string"));
                    }
                } else {
                    let v_start = i;
                    while i < b.len() && is_token_char(b[i]) {
                        i += 1;
                    }
                    value = s[v_start..i].to_string();
                }
            }
            params.push((name, value));
        }
        out.push(Link { target, params });
    }
}

/// RFC 9110 `tchar`, plus `*` for extended parameter names (`title*`).
fn is_token_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_target_is_found_in_every_shape_rfc_8288_allows() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (
                &[r#"<https://a/x?page=2>; rel="next""#],
                Some("https://a/x?page=2"),
            ),
            // Commas and semicolons inside the target.
            (
                &[r#"<http://h/v1/orders?page=2&fields=id,version>; rel="next""#],
                Some("http://h/v1/orders?page=2&fields=id,version"),
            ),
            (&[r#"<http://h/a;b,c>; rel=next"#], Some("http://h/a;b,c")),
            // Several links in one header, next not first.
            (
                &[
                    r#"<http://h/1>; rel="first", <http://h/3>; rel="next", <http://h/9>; rel="last""#,
                ],
                Some("http://h/3"),
            ),
            // Several headers.
            (
                &[r#"<http://h/1>; rel="prev""#, r#"<http://h/3>; rel="next""#],
                Some("http://h/3"),
            ),
            // A rel list, and any case.
            (&[r#"<http://h/3>; rel="last NEXT""#], Some("http://h/3")),
            (&[r#"<http://h/3>; REL="Next""#], Some("http://h/3")),
            // RFC 8288 section 3.5's examples.
            (
                &[
                    r#"<http://example.com/TheBook/chapter2>; rel="previous"; title="previous chapter""#,
                ],
                None,
            ),
            (
                &[
                    r#"</TheBook/chapter2>; rel="previous"; title*=UTF-8'de'letztes%20Kapitel, </TheBook/chapter4>; rel="next"; title*=UTF-8'de'n%c3%a4chstes%20Kapitel"#,
                ],
                Some("/TheBook/chapter4"),
            ),
            (
                &[r#"<http://example.org/>; rel="start http://example.net/relation/other""#],
                None,
            ),
            // Quoted parameters with commas and escapes do not split links.
            (
                &[r#"<http://h/1>; title="a, \"b\"; c"; rel="next""#],
                Some("http://h/1"),
            ),
            // Whitespace and empty list elements.
            (&[" , <http://h/2> ;rel = next ,"], Some("http://h/2")),
            (&[], None),
            (&[""], None),
            // rel only counts once.
            (&[r#"<http://h/2>; rel="prev"; rel="next""#], None),
        ];
        for (headers, want) in cases {
            let got = next_target(headers.iter().copied()).unwrap();
            assert_eq!(got.as_deref(), *want, "{headers:?}");
        }
    }

    #[test]
    fn malformed_headers_are_errors_not_a_silent_last_page() {
        for bad in [
            r#"http://h/2; rel="next""#,
            r#"<http://h/2; rel="next""#,
            r#"<http://h/2>; rel="next"#,
            r#"<http://h/2> rel="next""#,
            r#"<http://h/2>; ="next""#,
        ] {
            assert!(next_target([bad]).is_err(), "{bad}");
        }
        assert!(
            next_target([r#"<http://h/2>; rel="next", <http://h/3>; rel="next""#]).is_err(),
            "two different next targets"
        );
    }
}
