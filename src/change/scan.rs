//! A listed item read in one pass over its JSON text. Pure.
//!
//! A sweep reads a million items to compare each one's version and state digest with
//! the local row; as `serde_json::Value` every key, string and number (arbitrary
//! precision keeps numbers as text) of every item would be an allocation, and writing
//! the canonical state a second walk that escapes every string again. [`Json`] borrows
//! the item's text instead: a string without escapes and a number stay slices of it, an
//! object's entries are sorted once as they are read, and the canonical state is written
//! from the slices (`limits::canonical_text`). The result is the same text
//! `limits::canonical_state` writes from a `Value` (tested below against it).

use serde_json::Value;

/// serde_json's default recursion limit: the page scan refuses deeper documents already.
const MAX_DEPTH: usize = 128;

/// A JSON value borrowing the text it was read from.
#[derive(Debug)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    /// The number as the sender wrote it (checked against JSON's grammar).
    Number(&'a str),
    String(Text<'a>),
    Array(Vec<Json<'a>>),
    /// Sorted by key, each key once: the last one written wins, as in serde_json's map.
    Object(Vec<(Text<'a>, Json<'a>)>),
}

/// A string: the text between its quotes, decoded only when it has escapes.
#[derive(Debug)]
pub struct Text<'a> {
    raw: &'a str,
    decoded: Option<String>,
}

impl<'a> Text<'a> {
    pub fn as_str(&self) -> &str {
        self.decoded.as_deref().unwrap_or(self.raw)
    }

    /// The text as written, when it had no escapes: it is then its own JSON spelling
    /// (serde_json escapes only quotes, backslashes and control characters, none of
    /// which can stand unescaped in a JSON string).
    pub fn verbatim(&self) -> Option<&'a str> {
        self.decoded.is_none().then_some(self.raw)
    }
}

/// Reads one JSON value (whitespace around it allowed).
pub fn parse(text: &str) -> Result<Json<'_>, String> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    p.skip_whitespace();
    let v = p.value(0)?;
    p.skip_whitespace();
    if p.at != p.bytes.len() {
        return Err(p.error("trailing characters"));
    }
    Ok(v)
}

/// Reads a JSON array (whitespace around it allowed), handing each element to `each` as
/// soon as it is read, so that a page's items are read one at a time and only one
/// item's tree exists at once. On an error, `each` may have seen the elements before it.
pub fn each_element<'a>(text: &'a str, mut each: impl FnMut(Json<'a>)) -> Result<(), String> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    p.skip_whitespace();
    if p.peek() != Some(b'[') {
        return Err(p.error("expected an array"));
    }
    p.elements(1, &mut each)?;
    p.skip_whitespace();
    if p.at != p.bytes.len() {
        return Err(p.error("trailing characters"));
    }
    Ok(())
}

impl<'a> Json<'a> {
    /// The value at an RFC 6901 pointer, with `serde_json::Value::pointer`'s rules.
    pub fn pointer(&self, pointer: &str) -> Option<&Json<'a>> {
        if pointer.is_empty() {
            return Some(self);
        }
        let rest = pointer.strip_prefix('/')?;
        rest.split('/').try_fold(self, |target, token| {
            let token = if token.contains('~') {
                token.replace("~1", "/").replace("~0", "~").into()
            } else {
                std::borrow::Cow::Borrowed(token)
            };
            match target {
                Json::Object(entries) => entries
                    .binary_search_by(|(k, _)| k.as_str().cmp(&token))
                    .ok()
                    .map(|i| &entries[i].1),
                Json::Array(items) => array_index(&token).and_then(|i| items.get(i)),
                _ => None,
            }
        })
    }

    /// As a `serde_json::Value` (for the small values an id or a version is).
    pub fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => n
                .parse::<serde_json::Number>()
                .map_or(Value::Null, Value::Number),
            Json::String(s) => Value::String(s.as_str().to_string()),
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

/// serde_json's array index in a pointer: decimal, no sign, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.at)
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        self.skip_whitespace();
        if self.peek() == Some(b) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected {:?}", b as char)))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json<'a>, String> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(Json::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'n') => self.literal("null", Json::Null),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            _ => Err(self.error("expected a value")),
        }
    }

    fn literal(&mut self, word: &str, v: Json<'a>) -> Result<Json<'a>, String> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(v)
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at - start
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Result<Json<'a>, String> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(self.error("invalid number"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("invalid number"));
            }
        }
        Ok(Json::Number(&self.text[start..self.at]))
    }

    fn string(&mut self) -> Result<Text<'a>, String> {
        let open = self.at;
        self.at += 1;
        let mut escaped = false;
        loop {
            match self.peek() {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    // The escaped character cannot close the string; serde_json checks
                    // the escape itself below.
                    self.at += 2;
                }
                Some(0..=0x1f) => return Err(self.error("control character in a string")),
                Some(_) => self.at += 1,
                None => return Err(self.error("unterminated string")),
            }
        }
        let close = self.at;
        self.at += 1;
        let raw = self
            .text
            .get(open + 1..close)
            .ok_or_else(|| self.error("unterminated string"))?;
        let decoded = if escaped {
            let quoted = &self.text[open..=close];
            Some(serde_json::from_str::<String>(quoted).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(Text { raw, decoded })
    }

    fn array(&mut self, depth: usize) -> Result<Json<'a>, String> {
        let mut items = Vec::new();
        self.elements(depth, &mut |item| items.push(item))?;
        Ok(Json::Array(items))
    }

    /// An array's elements, each handed to `each` as soon as it is read.
    fn elements(&mut self, depth: usize, each: &mut dyn FnMut(Json<'a>)) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(self.error("recursion limit exceeded"));
        }
        self.at += 1;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            each(self.value(depth)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json<'a>, String> {
        if depth > MAX_DEPTH {
            return Err(self.error("recursion limit exceeded"));
        }
        self.at += 1;
        let mut entries: Vec<(Text<'a>, Json<'a>)> = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(entries));
        }
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a key"));
            }
            let key = self.string()?;
            self.expect(b':')?;
            self.skip_whitespace();
            let v = self.value(depth)?;
            entries.push((key, v));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    break;
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
        // Stable: of equal keys the last written stays last, and is the one kept.
        if !entries.is_sorted_by(|a, b| a.0.as_str() < b.0.as_str()) {
            entries.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
            let mut kept: Vec<(Text<'a>, Json<'a>)> = Vec::with_capacity(entries.len());
            for e in entries {
                match kept.last_mut() {
                    Some(last) if last.0.as_str() == e.0.as_str() => *last = e,
                    _ => kept.push(e),
                }
            }
            entries = kept;
        }
        Ok(Json::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::limits::{canonical_state, canonical_text};
    use proptest::prelude::*;

    /// The text `canonical_state` writes from serde_json's tree, or that it refused.
    fn by_value(text: &str, max: usize) -> Option<String> {
        let v: Value = serde_json::from_str(text).ok()?;
        canonical_state(&v, max).ok()
    }

    fn by_scan(text: &str, max: usize) -> Option<String> {
        canonical_text(&parse(text).ok()?, max).ok()
    }

    #[test]
    fn the_canonical_text_is_the_one_serde_json_s_tree_gives() {
        let cases = [
            r#"{"b":1,"a":[true,false,null],"c":{"z":"x","y":-0.0}}"#,
            r#" { "k" : "v\n\"q\"\u00e9\ud83d\ude00" , "k2":1e3 ,"K":1.5E-2} "#,
            r#"{"dup":1,"a":2,"dup":3}"#,
            r#"{"a\u0062":1,"ab":2,"aa":3}"#,
            r#"{"é":1,"z":2,"\u00e9":3}"#,
            r#"[1,-0,0.000,12345678901234567890123,"\/"]"#,
            r#""just a string""#,
            "{}",
            "[]",
            "-1.0e+2",
            r#"{"s":"tab\there","u":"\u001f"}"#,
        ];
        for text in cases {
            let want = by_value(text, 1 << 20);
            assert!(want.is_some(), "{text}");
            assert_eq!(by_scan(text, 1 << 20), want, "{text}");
        }
    }

    #[test]
    fn what_serde_json_refuses_or_canonical_state_refuses_is_refused() {
        for text in [
            r#"{"a":1"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":-}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\ud800"}"#,
            "{\"a\":\"raw\ttab\"}",
            r#"{"a":1}x"#,
            r#"{"a":tru}"#,
            r#"{"a":"nul\u0000"}"#,
            r#"{"nul\u0000":1}"#,
            r#"{"big":1e131072}"#,
            r#"[1,]"#,
            r#"{,}"#,
            "",
        ] {
            assert_eq!(by_scan(text, 1 << 20), None, "{text}");
            assert_eq!(by_value(text, 1 << 20), None, "{text}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse(&deep).is_err());
        // Too large once written: refused the same way.
        assert_eq!(by_scan(r#"{"n":1e100}"#, 50), None);
        assert_eq!(by_value(r#"{"n":1e100}"#, 50), None);
    }

    #[test]
    fn an_array_s_elements_are_handed_over_one_by_one() {
        let mut seen = Vec::new();
        each_element(r#" [ {"id":"a"}, 2 ,"x",[] ] "#, |item| {
            seen.push(item.to_value())
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![
                serde_json::json!({"id":"a"}),
                2.into(),
                "x".into(),
                serde_json::json!([])
            ]
        );
        let mut count = 0;
        each_element("[]", |_| count += 1).unwrap();
        assert_eq!(count, 0);
        for broken in [r#"{"a":1}"#, "[1,", "[1 2]", "[1]x", r#"[{"a":01}]"#, ""] {
            assert!(each_element(broken, |_| ()).is_err(), "{broken}");
        }
    }

    #[test]
    fn pointers_follow_serde_json_s_rules() {
        let text = r#"{"a":{"b/c":[10,{"d~e":"x"}]},"n":7,"0":"zero"}"#;
        let doc = parse(text).unwrap();
        let v: Value = serde_json::from_str(text).unwrap();
        for p in [
            "",
            "/a",
            "/a/b~1c",
            "/a/b~1c/0",
            "/a/b~1c/1/d~0e",
            "/a/b~1c/01",
            "/a/b~1c/+1",
            "/a/b~1c/9",
            "/n",
            "/0",
            "/missing",
            "a",
            "/n/x",
        ] {
            assert_eq!(
                doc.pointer(p).map(Json::to_value),
                v.pointer(p).cloned(),
                "{p}"
            );
        }
    }

    fn json_text() -> impl Strategy<Value = String> {
        let key =
            prop::sample::select(vec!["a", "b", "B", "id", "é", "a\\u0062", "ab", "\\n", "z"]);
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            prop::sample::select(vec![
                "0",
                "-0",
                "1",
                "-17",
                "3.25",
                "1e3",
                "1E-2",
                "-0.0e0",
                "123456789012345678901",
                "2.50",
                "1e400",
                "0.1e-3",
            ])
            .prop_map(str::to_string),
            "[a-zé😀 \"\\\\/]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just(r#""\u00e9\t\"x""#.to_string()),
        ];
        leaf.prop_recursive(4, 40, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[{}]", items.join(" , "))),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|entries| {
                    let body: Vec<String> = entries
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\": {v}"))
                        .collect();
                    format!("{{ {} }}", body.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_document_reads_as_serde_json_reads_it(text in json_text(), max in 1usize..400) {
            prop_assert_eq!(by_scan(&text, 1 << 20), by_value(&text, 1 << 20));
            prop_assert_eq!(by_scan(&text, max), by_value(&text, max));
            let v: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(parse(&text).unwrap().to_value(), v);
        }
    }
}
