//! A database password kept out of everything printed: the URL as shown, and what a
//! driver says about the URL.

use super::is_password_key;

/// The URL with every password libpq could read out of it masked: a password in the
/// user info, however written (libpq takes `postgres://u:PW?x@host` whole), and the
/// `password` and `sslpassword` parameters, with their keys percent-decoded
/// (`pass%77ord`). Masking too much is fine here; printing a secret is not.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // Parameters first, split at every `?` and `&`: a `?` may also sit in a password.
    let mut params = String::with_capacity(rest.len());
    let mut at = 0;
    for segment in rest.split(['?', '&']) {
        if at > 0 {
            // The delimiter this segment followed, as written.
            params.push_str(&rest[at - 1..at]);
        }
        at += segment.len() + 1;
        match segment.split_once('=') {
            Some((key, _)) if is_password_key(key) => {
                params.push_str(key);
                params.push_str("=***");
            }
            _ => params.push_str(segment),
        }
    }
    // Then the user info: everything between the first `:` and the last `@`.
    let masked = match params.rfind('@') {
        Some(at) => match params[..at].find(':') {
            Some(colon) => format!("{}:***{}", &params[..colon], &params[at..]),
            None => params,
        },
        None => params,
    };
    format!("{scheme}://{masked}")
}

/// `message` (a driver's error about `url`) with every piece of `url`'s password masked:
/// libpq quotes what it could not parse, and a password with a raw `/` or `@` is cut
/// there and shown as a port or a host name.
pub fn redact_secrets_in(message: &str, url: &str) -> String {
    let Some((_, rest)) = url.split_once("://") else {
        return message.to_string();
    };
    let mut secrets = Vec::new();
    if let Some(at) = rest.rfind('@') {
        if let Some((_, password)) = rest[..at].split_once(':') {
            secrets.push(password.to_string());
        }
    }
    for segment in rest.split(['?', '&']) {
        if let Some((key, value)) = segment.split_once('=') {
            if is_password_key(key) {
                secrets.push(value.to_string());
            }
        }
    }
    let mut out = message.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = mask_fragments(&out, secret);
    }
    out
}

/// `text` with every run of at least 4 characters (the whole secret, if shorter) that
/// also occurs in `secret` replaced by `***`.
fn mask_fragments(text: &str, secret: &str) -> String {
    let shortest = secret.len().min(4);
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let longest = (shortest..=secret.len().min(text.len() - i))
            .rev()
            .find(|n| text.is_char_boundary(i + n) && secret.contains(&text[i..i + n]));
        match longest {
            Some(n) => {
                out.push_str("***");
                i += n;
            }
            None => {
                let c = text[i..].chars().next().unwrap_or(' ');
                out.push(c);
                i += c.len_utf8().max(1);
            }
        }
    }
    out
}
