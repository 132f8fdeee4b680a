//! `prove`: the guide's receiver tests, sent to anyone's running receiver as its sender
//! would send them, with the effect read back through a probe the user names.
//!
//! Seven cases (SPEC "Proving any receiver"): a repeated delivery, three concurrent
//! deliveries of one event, an older update after a newer one, a burst of 200 (100
//! events twice, shuffled, at once), a delivery abandoned before its answer and retried,
//! a forged signature, an old timestamp. About 211 deliveries in all; no redirect is
//! followed; ids are `prove_` and random per run.

pub mod probe;
pub mod sign;

use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use serde::Serialize;

use crate::config::{Scheme, WebhookSecret};
use probe::{Probe, ProbeError};

/// The guide's refund event, with the placeholders `prove` fills in.
pub const DEFAULT_TEMPLATE: &str = r#"{"id": "{event_id}", "type": "refund.succeeded", "created_at": "{created}", "api_version": "2026-07-01", "data": {"refund_id": "{resource_id}", "order_id": "ord_42", "version": {version}, "amount": 4200, "currency": "EUR"}}"#;

/// Deliveries in the burst: 100 events, each twice.
const BURST_EVENTS: usize = 100;

pub struct Setup {
    pub url: String,
    pub scheme: Scheme,
    pub scheme_name: String,
    pub secret: WebhookSecret,
    pub template: String,
    pub count: Probe,
    pub version: Option<Probe>,
    /// Per request.
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Passed,
    Failed,
    Skipped,
    /// The probe gave no answer: not the receiver's failure, but not a pass either.
    ProbeError,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub name: &'static str,
    pub verdict: Verdict,
    /// Status codes, probe values, what was expected.
    pub evidence: String,
    pub millis: u64,
}

/// A rendered delivery.
struct Delivery {
    event_id: String,
    body: String,
    event_type: String,
}

struct Run<'a> {
    setup: &'a Setup,
    /// Deliveries and URL probes alike.
    http: reqwest::Client,
    prefix: String,
    n: std::sync::atomic::AtomicUsize,
}

/// Checks the template: JSON once filled in, an `{event_id}` in it.
pub fn check_template(template: &str) -> Result<(), String> {
    if !template.contains("{event_id}") {
        return Err(
            "the template has no {event_id}: every delivery would carry the same id".into(),
        );
    }
    let filled = fill(template, "prove_x", "prove_r", 1, 1_700_000_000);
    serde_json::from_str::<serde_json::Value>(&filled)
        .map(|_| ())
        .map_err(|e| format!("the template is not JSON once its placeholders are filled in: {e}"))
}

fn fill(template: &str, event_id: &str, resource_id: &str, version: i64, now: i64) -> String {
    let created = chrono::DateTime::from_timestamp(now, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default();
    template
        .replace("{event_id}", event_id)
        .replace("{resource_id}", resource_id)
        .replace("{version}", &version.to_string())
        .replace("{created_unix}", &now.to_string())
        .replace("{created}", &created)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Runs the seven cases in order; each result is handed to `report` as it ends.
pub async fn prove(setup: &Setup, report: &mut dyn FnMut(&CaseResult)) -> Vec<CaseResult> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(setup.timeout)
        .pool_max_idle_per_host(256)
        .build()
        .unwrap_or_default();
    let run = Run {
        setup,
        http,
        prefix: format!("prove_{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff),
        n: Default::default(),
    };
    let mut results = Vec::new();
    let cases: [(&'static str, Case); 7] = [
        (
            "a repeated delivery applies the effect once",
            Case::Repeated,
        ),
        (
            "three concurrent deliveries of one event apply it once",
            Case::Concurrent,
        ),
        (
            "an older update after a newer one leaves the newer state",
            Case::Order,
        ),
        (
            "a burst of 200 deliveries, half duplicates, applies exactly 100",
            Case::Burst,
        ),
        (
            "a delivery answered after the sender gave up, then retried, applies once",
            Case::Abandoned,
        ),
        (
            "a forged signature is refused with 4xx and no effect",
            Case::Forged,
        ),
        (
            "a delivery older than the tolerance is refused with 4xx and no effect",
            Case::Old,
        ),
    ];
    for (name, case) in cases {
        let started = Instant::now();
        let (verdict, evidence) = match run.case(case).await {
            Ok(v) => v,
            Err(e) => (Verdict::ProbeError, format!("probe error: {e}")),
        };
        let r = CaseResult {
            name,
            verdict,
            evidence,
            millis: started.elapsed().as_millis() as u64,
        };
        report(&r);
        results.push(r);
    }
    results
}

#[derive(Clone, Copy)]
enum Case {
    Repeated,
    Concurrent,
    Order,
    Burst,
    Abandoned,
    Forged,
    Old,
}

type Outcome = Result<(Verdict, String), ProbeError>;

impl Run<'_> {
    fn next_id(&self, what: &str) -> String {
        let n = self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}_{what}{n}", self.prefix)
    }

    fn delivery(&self, resource_id: &str, version: i64) -> Delivery {
        let event_id = self.next_id("e");
        let body = fill(&self.setup.template, &event_id, resource_id, version, now());
        let event_type = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(String::from))
            .unwrap_or_else(|| "prove".into());
        Delivery {
            event_id,
            body,
            event_type,
        }
    }

    fn fresh(&self) -> Delivery {
        let resource = self.next_id("r");
        self.delivery(&resource, 1)
    }

    fn signed_headers(
        &self,
        d: &Delivery,
        secret: &WebhookSecret,
        at: i64,
    ) -> Vec<(String, String)> {
        let mut h = sign::headers(
            &self.setup.scheme,
            secret,
            &d.event_id,
            &d.event_type,
            at,
            d.body.as_bytes(),
        );
        h.push(("Content-Type".into(), "application/json".into()));
        h.push(("User-Agent".into(), "webhook-reconciler-prove".into()));
        h
    }

    /// Sends `d`; the status code, or the transport error's text.
    async fn send_as(&self, d: &Delivery, secret: &WebhookSecret, at: i64) -> Result<u16, String> {
        let mut req = self.http.post(&self.setup.url).body(d.body.clone());
        for (k, v) in self.signed_headers(d, secret, at) {
            req = req.header(k, v);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                // Read the answer, as a sender does, so the connection is reused; a
                // longer one is cut off (and its connection closed), never held whole.
                let _ = probe::read_at_most(r, probe::MAX_ANSWER).await;
                Ok(status)
            }
            Err(e) if e.is_timeout() => Err(format!("no answer within {:?}", self.setup.timeout)),
            Err(e) => Err(e.without_url().to_string()),
        }
    }

    async fn send(&self, d: &Delivery) -> Result<u16, String> {
        self.send_as(d, &self.setup.secret, now()).await
    }

    async fn count(&self, event_id: &str) -> Result<i64, ProbeError> {
        Ok(self
            .setup
            .count
            .read(&self.http, "event_id", event_id)
            .await?
            .unwrap_or(0))
    }

    /// The count once two reads `SETTLE` apart agree (effects may land after the
    /// answer), or the last of 20 reads.
    async fn settled_count(&self, event_id: &str) -> Result<i64, ProbeError> {
        let mut last = self.count(event_id).await?;
        for _ in 0..20 {
            tokio::time::sleep(probe::SETTLE).await;
            let now = self.count(event_id).await?;
            if now == last {
                break;
            }
            last = now;
        }
        Ok(last)
    }

    async fn case(&self, case: Case) -> Outcome {
        match case {
            Case::Repeated => {
                let d = self.fresh();
                let first = self.send(&d).await;
                let second = self.send(&d).await;
                let applied = self.settled_count(&d.event_id).await?;
                let ok = is_2xx(&first) && is_2xx(&second) && applied == 1;
                Ok(verdict(
                    ok,
                    format!(
                        "answers {}, {}; applied {applied} time(s) (expected 2xx, 2xx and 1)",
                        shown(&first),
                        shown(&second)
                    ),
                ))
            }
            Case::Concurrent => {
                let d = self.fresh();
                let (a, b, c) = tokio::join!(self.send(&d), self.send(&d), self.send(&d));
                let applied = self.settled_count(&d.event_id).await?;
                let ok = [&a, &b, &c].iter().all(|r| is_2xx(r)) && applied == 1;
                Ok(verdict(
                    ok,
                    format!(
                        "answers {}, {}, {}; applied {applied} time(s) (expected 2xx each and 1)",
                        shown(&a),
                        shown(&b),
                        shown(&c)
                    ),
                ))
            }
            Case::Order => {
                let Some(version) = &self.setup.version else {
                    return Ok((
                        Verdict::Skipped,
                        "no version probe (--probe-version-sql or --probe-version-url): which state the receiver holds cannot be read".into(),
                    ));
                };
                let resource = self.next_id("r");
                let newer = self.delivery(&resource, 5);
                let older = self.delivery(&resource, 4);
                let a = self.send(&newer).await;
                let b = self.send(&older).await;
                tokio::time::sleep(probe::SETTLE).await;
                let held = version.read(&self.http, "resource_id", &resource).await?;
                let ok = is_2xx(&a) && is_2xx(&b) && held == Some(5);
                Ok(verdict(
                    ok,
                    format!(
                        "version 5 answered {}, then version 4 answered {}; the receiver holds version {} (expected 5)",
                        shown(&a),
                        shown(&b),
                        held.map_or("none".to_string(), |v| v.to_string())
                    ),
                ))
            }
            Case::Burst => {
                let events: Vec<Delivery> = (0..BURST_EVENTS).map(|_| self.fresh()).collect();
                let mut burst: Vec<&Delivery> = events.iter().chain(events.iter()).collect();
                burst.shuffle(&mut rand::rng());
                let answers =
                    futures_util::future::join_all(burst.iter().map(|d| self.send(d))).await;
                let refused = answers.iter().filter(|a| !is_2xx(a)).count();
                // Let the stragglers land, then read every event's count.
                tokio::time::sleep(probe::SETTLE).await;
                let mut total = 0;
                let mut twice = Vec::new();
                let mut missing = 0;
                for d in &events {
                    let n = self.count(&d.event_id).await?;
                    total += n;
                    if n > 1 {
                        twice.push(format!("{} ×{n}", d.event_id));
                    }
                    if n == 0 {
                        missing += 1;
                    }
                }
                let ok = refused == 0 && total == BURST_EVENTS as i64;
                let mut evidence = format!(
                    "200 deliveries: {} answered 2xx; applied {total} effects (expected {BURST_EVENTS})",
                    200 - refused
                );
                if !twice.is_empty() {
                    evidence.push_str(&format!(
                        "; applied more than once: {}{}",
                        twice.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
                        if twice.len() > 3 {
                            format!(" and {} more", twice.len() - 3)
                        } else {
                            String::new()
                        }
                    ));
                }
                if missing > 0 {
                    evidence.push_str(&format!("; {missing} event(s) never applied"));
                }
                if refused > 0 {
                    let first = answers
                        .iter()
                        .find(|a| !is_2xx(a))
                        .map(shown)
                        .unwrap_or_default();
                    evidence.push_str(&format!("; {refused} not answered 2xx (first: {first})"));
                }
                Ok(verdict(ok, evidence))
            }
            Case::Abandoned => {
                let d = self.fresh();
                let first = self.abandon(&d).await;
                // The sender retries while the first attempt may still be running.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let retry = self.send(&d).await;
                let applied = self.settled_count(&d.event_id).await?;
                let ok = is_2xx(&retry) && applied == 1;
                Ok(verdict(
                    ok,
                    format!(
                        "first attempt {first}; the retry answered {}; applied {applied} time(s) (expected 2xx and 1)",
                        shown(&retry)
                    ),
                ))
            }
            Case::Forged => {
                let d = self.fresh();
                let other = WebhookSecret::from_bytes(
                    format!("not-the-secret-{}", self.prefix).into_bytes(),
                );
                let answer = self.send_as(&d, &other, now()).await;
                let applied = self.settled_count(&d.event_id).await?;
                let ok = is_4xx(&answer) && applied == 0;
                Ok(verdict(
                    ok,
                    format!(
                        "answered {}; applied {applied} time(s) (expected 4xx and 0)",
                        shown(&answer)
                    ),
                ))
            }
            Case::Old => {
                if !sign::has_timestamp(&self.setup.scheme) {
                    return Ok((
                        Verdict::Skipped,
                        format!(
                            "scheme {} signs no timestamp: an old delivery cannot be told from a new one (its event id is what stops a replay)",
                            self.setup.scheme_name
                        ),
                    ));
                }
                let d = self.fresh();
                let hour_ago = now() - 3600;
                let answer = self.send_as(&d, &self.setup.secret, hour_ago).await;
                let applied = self.settled_count(&d.event_id).await?;
                let ok = is_4xx(&answer) && applied == 0;
                Ok(verdict(
                    ok,
                    format!(
                        "signed an hour ago, answered {}; applied {applied} time(s) (expected 4xx and 0)",
                        shown(&answer)
                    ),
                ))
            }
        }
    }

    /// The first attempt of the abandoned case: on `http://`, the whole request written
    /// and the connection closed before the answer is read (the receiver has it all,
    /// the sender never sees the answer); on `https://`, a request given up after 1 ms
    /// past its sending.
    async fn abandon(&self, d: &Delivery) -> String {
        let Some(rest) = self.setup.url.strip_prefix("http://") else {
            let short = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_millis(1))
                .build()
                .unwrap_or_default();
            let mut req = short.post(&self.setup.url).body(d.body.clone());
            for (k, v) in self.signed_headers(d, &self.setup.secret, now()) {
                req = req.header(k, v);
            }
            return match req.send().await {
                Ok(r) => format!("answered {} before the 1 ms timeout", r.status().as_u16()),
                Err(_) => {
                    "given up 1 ms after sending (https: whether it arrived whole is not known)"
                        .into()
                }
            };
        };
        let (authority, path) = rest
            .split_once('/')
            .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
        let addr = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\nConnection: close\r\n",
            d.body.len()
        );
        for (k, v) in self.signed_headers(d, &self.setup.secret, now()) {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(&d.body);
        use tokio::io::AsyncWriteExt;
        let sent = tokio::time::timeout(self.setup.timeout, async {
            let mut s = tokio::net::TcpStream::connect(&addr).await?;
            s.write_all(request.as_bytes()).await?;
            s.flush().await?;
            // Long enough for the request to be read; short of any answer a sender
            // waiting for its timeout would have taken.
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(s);
            Ok::<_, std::io::Error>(())
        })
        .await;
        match sent {
            Ok(Ok(())) => "sent whole, the connection closed unanswered".into(),
            Ok(Err(e)) => format!("could not be sent ({e})"),
            Err(_) => "could not be sent within the timeout".into(),
        }
    }
}

fn verdict(ok: bool, evidence: String) -> (Verdict, String) {
    (if ok { Verdict::Passed } else { Verdict::Failed }, evidence)
}

fn is_2xx(r: &Result<u16, String>) -> bool {
    matches!(r, Ok(s) if (200..300).contains(s))
}

fn is_4xx(r: &Result<u16, String>) -> bool {
    matches!(r, Ok(s) if (400..500).contains(s))
}

fn shown(r: &Result<u16, String>) -> String {
    match r {
        Ok(s) => s.to_string(),
        Err(e) => format!("({e})"),
    }
}

/// The runner's lines: a mark, the name, the time; the evidence under a case that did
/// not pass.
pub fn line(r: &CaseResult) -> String {
    let mark = match r.verdict {
        Verdict::Passed => "✓",
        Verdict::Failed => "✗",
        Verdict::Skipped => "-",
        Verdict::ProbeError => "!",
    };
    match r.verdict {
        Verdict::Passed => format!("  {mark} {} ({} ms)", r.name, r.millis),
        Verdict::Skipped => format!("  {mark} {} (skipped: {})", r.name, r.evidence),
        _ => format!(
            "  {mark} {} ({} ms)\n      {}",
            r.name, r.millis, r.evidence
        ),
    }
}

/// `Tests: 6 passed, 1 failed, 7 total`.
pub fn summary(results: &[CaseResult]) -> String {
    let count = |v: Verdict| results.iter().filter(|r| r.verdict == v).count();
    let mut parts = Vec::new();
    for (v, word) in [
        (Verdict::Passed, "passed"),
        (Verdict::Failed, "failed"),
        (Verdict::ProbeError, "probe errors"),
        (Verdict::Skipped, "skipped"),
    ] {
        let n = count(v);
        if n > 0 || v == Verdict::Passed {
            parts.push(format!("{n} {word}"));
        }
    }
    format!("Tests: {}, {} total", parts.join(", "), results.len())
}
