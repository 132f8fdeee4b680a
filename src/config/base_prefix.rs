//! Where a per-account API base may point: `[sources.NAME.accounts] api_bases`, prefixes
//! like `https://*.myshopify.com/`. A `*` stands for one whole host label (never part of
//! an IP address) or for the port; the path is a prefix ending in `/`. An address host
//! (loopback, private, link-local or any other) and `localhost` match only a prefix that
//! names them exactly: a wildcard never reaches them.

use std::net::IpAddr;

/// One allowed prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasePrefix {
    text: String,
    scheme: String,
    /// Host labels, lowercase; `"*"` for any one label.
    host: Vec<String>,
    /// `None`: any port.
    port: Option<u16>,
    path: String,
}

impl BasePrefix {
    /// `scheme://host[:port]/path/`: http(s), a host of labels or an address, a path
    /// ending in `/`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{text:?} {why}; write a prefix like \"https://*.myshopify.com/\" or \"http://127.0.0.1:8080/\""
            )
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("has no scheme"))?;
        if !matches!(scheme, "http" | "https") {
            return Err(bad("is not http(s)"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err(bad("must end its host with `/` (and its path too)")),
        };
        if !path.ends_with('/') || path.contains(['?', '#', '*']) {
            return Err(bad(
                "must have a path ending in `/`, without `?`, `#` or `*`",
            ));
        }
        if authority.contains(['@', '[', ']']) || authority.is_empty() {
            return Err(bad("must name a host (no user, no IPv6 literal)"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, "*")) => (h, None),
            Some((h, p)) => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| bad("has a port that is not a number or `*`"))?,
                ),
            ),
            None => (authority, Some(if scheme == "https" { 443 } else { 80 })),
        };
        let labels: Vec<String> = host.split('.').map(str::to_ascii_lowercase).collect();
        if labels.iter().any(|l| {
            l.is_empty() || (l != "*" && !l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        }) {
            return Err(bad(
                "has a host that is not dot-separated labels (a `*` is one whole label)",
            ));
        }
        if labels.iter().any(|l| l == "*") && labels.iter().filter(|l| *l != "*").count() < 2 {
            return Err(bad(
                "lets `*` stand for too much: keep at least two fixed labels (\"https://*.myshopify.com/\")",
            ));
        }
        Ok(Self {
            text: text.to_string(),
            scheme: scheme.to_string(),
            host: labels,
            port,
            path: path.to_string(),
        })
    }

    /// Whether `base` (a URL) starts with this prefix.
    pub fn allows(&self, base: &str) -> bool {
        let Ok(u) = url::Url::parse(base) else {
            return false;
        };
        if u.scheme() != self.scheme || !u.username().is_empty() || u.password().is_some() {
            return false;
        }
        let (Some(host), Some(port)) = (u.host_str(), u.port_or_known_default()) else {
            return false;
        };
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        let host = host.to_ascii_lowercase();
        let wildcard = self.host.iter().any(|l| l == "*");
        // An address or localhost only where named exactly.
        if wildcard
            && (host.parse::<IpAddr>().is_ok() || host.starts_with('[') || host == "localhost")
        {
            return false;
        }
        let labels: Vec<&str> = host.split('.').collect();
        if labels.len() != self.host.len()
            || !labels
                .iter()
                .zip(&self.host)
                .all(|(l, p)| p == "*" && !l.is_empty() || p == l)
        {
            return false;
        }
        let path = if u.path().ends_with('/') {
            u.path().to_string()
        } else {
            format!("{}/", u.path())
        };
        path.starts_with(&self.path)
    }
}

impl std::fmt::Display for BasePrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_is_one_host_label_and_never_an_address() {
        let shopify = BasePrefix::parse("https://*.myshopify.com/").unwrap();
        assert!(shopify.allows("https://a-shop.myshopify.com/admin/api/2025-01"));
        assert!(shopify.allows("https://A-SHOP.myshopify.com:443/"));
        for no in [
            "http://a.myshopify.com/admin",
            "https://myshopify.com/",
            "https://a.b.myshopify.com/",
            "https://a.myshopify.com.evil.com/",
            "https://evil.com/a.myshopify.com/",
            "https://a.myshopify.com:8443/",
            "https://user@a.myshopify.com/",
            "https://127.0.0.1/",
            "not a url",
        ] {
            assert!(!shopify.allows(no), "{no}");
        }
        let stripe = BasePrefix::parse("https://api.stripe.com/").unwrap();
        assert!(stripe.allows("https://api.stripe.com"));
        assert!(stripe.allows("https://api.stripe.com/v1"));
        assert!(!stripe.allows("https://api.stripe.com.evil.com/"));
        assert!(!stripe.allows("https://api.stripe.com@evil.com/"));
    }

    #[test]
    fn an_address_matches_only_where_it_is_named_and_a_path_prefix_is_whole_segments() {
        let local = BasePrefix::parse("http://127.0.0.1:*/").unwrap();
        assert!(local.allows("http://127.0.0.1:8080/x"));
        assert!(!local.allows("http://127.0.0.2:8080/x"));
        assert!(!local.allows("http://localhost:8080/x"));
        let api = BasePrefix::parse("https://api.example.com/v1/").unwrap();
        assert!(api.allows("https://api.example.com/v1/accounts/1"));
        assert!(api.allows("https://api.example.com/v1"));
        assert!(!api.allows("https://api.example.com/v10"));
        assert!(!api.allows("https://api.example.com/"));
    }

    #[test]
    fn a_prefix_that_would_allow_too_much_is_refused_with_an_example() {
        for bad in [
            "api.stripe.com/",
            "ftp://x.example.com/",
            "https://api.stripe.com",
            "https://*.com/",
            "https://*/",
            "https://x*.example.com/",
            "https://a.example.com/p*/",
            "https://a.example.com/p",
            "https://u@a.example.com/",
            "https://a.example.com:x/",
        ] {
            let e = BasePrefix::parse(bad).unwrap_err();
            assert!(e.contains("write a prefix like"), "{bad}: {e}");
        }
    }
}
