//! One request budget per source, shared by all its kinds, its catch-up and its `get`
//! calls: the configured rate (`requests_per_second`) and what the sender's own headers
//! say about its quota, so that parallel kinds slow down together before the sender
//! refuses them.
//!
//! - `Retry-After` (any status): no request of the source before it has passed.
//! - GitHub's `X-RateLimit-Remaining` / `X-RateLimit-Reset`: requests are counted down
//!   locally as they are sent (so parallel kinds cannot overspend what one response
//!   reported), and a response's count is lowered by the other requests still in flight
//!   (the sender may not have counted them yet: two kinds' first requests, sent before
//!   any count was known, made a window's sixth request of five); at 0 every request
//!   waits for the reset.
//! - Shopify's `X-Shopify-Shop-Api-Call-Limit: used/size` (a leaky bucket draining 2
//!   requests a second on standard plans): near full, requests wait for it to drain.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::header::HeaderMap;

/// Shopify's bucket drains this many requests a second on standard plans (faster on
/// Plus, where waiting this long is merely cautious).
const SHOPIFY_LEAK_PER_SECOND: f64 = 2.0;

#[derive(Debug, Default)]
struct State {
    /// No request before this (the sender asked to wait, or its bucket is near full).
    not_before: Option<Instant>,
    /// A counted quota: requests left, and when it resets (unix seconds).
    quota: Option<(u64, u64)>,
    /// Requests sent and not yet answered (or failed).
    in_flight: u64,
}

/// The budget of one source.
pub struct Budget {
    limiter: DefaultDirectRateLimiter,
    state: Mutex<State>,
}

/// One request on its way: hand it to [`Budget::observe`] with the response's headers,
/// or drop it when no response came.
#[must_use = "a request counts as in flight until this is observed or dropped"]
pub struct Sent<'a> {
    budget: &'a Budget,
}

impl std::fmt::Debug for Sent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sent")
    }
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        let mut st = self.budget.state();
        st.in_flight = st.in_flight.saturating_sub(1);
    }
}

/// The wait the sender asks for is longer than the run accepts.
#[derive(Debug)]
pub struct TooLong {
    pub wait: Duration,
    pub why: &'static str,
}

impl Budget {
    /// One request every 1/rps seconds, with a burst of one second's worth.
    pub fn new(requests_per_second: f64) -> Self {
        let period = Duration::from_secs_f64(1.0 / requests_per_second);
        let burst =
            NonZeroU32::new(requests_per_second.ceil().max(1.0) as u32).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Self {
            limiter: RateLimiter::direct(quota),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until one request may be sent, and counts it. Fails without waiting when
    /// the sender asks for a wait longer than `max_wait`.
    pub async fn acquire(&self, max_wait: Duration) -> Result<Sent<'_>, TooLong> {
        loop {
            let wait = {
                let mut st = self.state();
                let now = Instant::now();
                let epoch = unix_now();
                let wait = match (st.not_before, st.quota) {
                    (Some(t), _) if t > now => Some((t - now, "the sender asked to wait")),
                    (_, Some((0, reset))) if reset >= epoch => Some((
                        // Its reset second may not have ended yet on the sender's clock.
                        Duration::from_secs(reset - epoch + 1),
                        "the sender's request quota is spent until its reset",
                    )),
                    (_, Some((0, _))) => {
                        st.quota = None;
                        None
                    }
                    (_, Some((n, reset))) => {
                        st.quota = Some((n - 1, reset));
                        None
                    }
                    (_, None) => None,
                };
                if wait.is_none() {
                    st.in_flight += 1;
                }
                wait
            };
            match wait {
                None => break,
                Some((wait, why)) if wait > max_wait => return Err(TooLong { wait, why }),
                Some((wait, why)) => {
                    tracing::info!(wait = ?wait, why, "waiting for the sender's rate limit");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        let sent = Sent { budget: self };
        self.limiter.until_ready().await;
        Ok(sent)
    }

    /// Learns from the response to `sent`'s request. Returns how long to wait before
    /// retrying a refused request, when the headers say (quota spent, `Retry-After`).
    pub fn observe(&self, headers: &HeaderMap, sent: Sent<'_>) -> Option<Duration> {
        let wait = self.learn(headers);
        drop(sent);
        wait
    }

    fn learn(&self, headers: &HeaderMap) -> Option<Duration> {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let mut st = self.state();
        // This response's request is one of them.
        let others = st.in_flight.saturating_sub(1);
        let now = Instant::now();
        let mut wait = get("retry-after").and_then(parse_retry_after);
        if let (Some(remaining), Some(reset)) = (
            get("x-ratelimit-remaining").and_then(|v| v.trim().parse::<u64>().ok()),
            get("x-ratelimit-reset").and_then(|v| v.trim().parse::<u64>().ok()),
        ) {
            // The requests still in flight may not be in the sender's count yet.
            let left = remaining.saturating_sub(others);
            st.quota = match st.quota {
                // The same window: the lower count wins (responses arrive out of order,
                // and requests counted here may not have reached the sender yet).
                Some((n, r)) if r == reset => Some((n.min(left), reset)),
                // A late answer from a window that has ended says nothing about the
                // current one; taking it would forget the requests counted since.
                Some((n, r)) if r > reset => Some((n, r)),
                _ => Some((left, reset)),
            };
            if remaining == 0 {
                let until = Duration::from_secs(reset.saturating_sub(unix_now()) + 1);
                wait = Some(wait.map_or(until, |w| w.max(until)));
            }
        }
        if let Some((used, size)) = get("x-shopify-shop-api-call-limit").and_then(parse_call_limit)
        {
            // Requests of other kinds may be on their way already: keep a fifth free.
            let margin = (size / 5).max(3);
            if used + margin >= size {
                let excess = (used + margin + 1 - size) as f64;
                let drain = Duration::from_secs_f64(excess / SHOPIFY_LEAK_PER_SECOND);
                st.not_before = Some(st.not_before.map_or(now + drain, |t| t.max(now + drain)));
            }
        }
        if let Some(w) = wait {
            st.not_before = Some(st.not_before.map_or(now + w, |t| t.max(now + w)));
        }
        wait
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `used/size`.
fn parse_call_limit(v: &str) -> Option<(u64, u64)> {
    let (used, size) = v.trim().split_once('/')?;
    let (used, size) = (used.trim().parse().ok()?, size.trim().parse().ok()?);
    (size > 0).then_some((used, size))
}

/// `Retry-After` in seconds (the HTTP-date form is rare for APIs; it is ignored and the
/// backoff applies).
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[tokio::test]
    async fn a_spent_quota_holds_every_request_until_its_reset() {
        let b = Budget::new(1000.0);
        let reset = unix_now() + 3600;
        let h = headers(&[
            ("x-ratelimit-remaining", "2".into()),
            ("x-ratelimit-reset", reset.to_string()),
        ]);
        assert_eq!(b.learn(&h), None);
        let max = Duration::from_secs(60);
        assert!(b.acquire(max).await.is_ok());
        assert!(b.acquire(max).await.is_ok());
        let refused = b.acquire(max).await.unwrap_err();
        assert!(refused.wait > Duration::from_secs(3500), "{refused:?}");
        // A stale response reporting more left does not raise the local count.
        let stale = headers(&[
            ("x-ratelimit-remaining", "5".into()),
            ("x-ratelimit-reset", reset.to_string()),
        ]);
        b.learn(&stale);
        assert!(b.acquire(max).await.is_err());
    }

    #[tokio::test]
    async fn a_late_answer_from_an_ended_window_does_not_replace_the_current_one() {
        let b = Budget::new(1000.0);
        let now = unix_now();
        let quota = |remaining: u64, reset: u64| {
            headers(&[
                ("x-ratelimit-remaining", remaining.to_string()),
                ("x-ratelimit-reset", reset.to_string()),
            ])
        };
        b.learn(&quota(1, now + 3600));
        // Sent before the window turned, answered after: 4 left in a window that is over.
        b.learn(&quota(4, now.saturating_sub(1)));
        let max = Duration::from_secs(60);
        assert!(b.acquire(max).await.is_ok());
        assert!(
            b.acquire(max).await.is_err(),
            "one request was left in the current window"
        );
    }

    #[tokio::test]
    async fn requests_still_in_flight_are_taken_off_a_count_that_may_not_include_them() {
        let b = Budget::new(1000.0);
        let max = Duration::from_secs(60);
        let reset = unix_now() + 3600;
        // Two kinds' first requests, sent before any count was known.
        let first = b.acquire(max).await.unwrap();
        let _second = b.acquire(max).await.unwrap();
        // The sender counted the first only when it answered: 4 of 5 left, and the
        // second will take one of them.
        let h = headers(&[
            ("x-ratelimit-remaining", "4".into()),
            ("x-ratelimit-reset", reset.to_string()),
        ]);
        assert_eq!(b.observe(&h, first), None);
        for n in 0..3 {
            assert!(b.acquire(max).await.is_ok(), "request {n} of the 3 left");
        }
        assert!(
            b.acquire(max).await.is_err(),
            "a sixth request in a window of five"
        );
    }

    #[test]
    fn a_refusal_with_a_spent_quota_says_how_long_to_wait() {
        let b = Budget::new(10.0);
        let h = headers(&[
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", (unix_now() + 5).to_string()),
        ]);
        let w = b.learn(&h).unwrap();
        assert!(
            w >= Duration::from_secs(5) && w <= Duration::from_secs(7),
            "{w:?}"
        );
        let h = headers(&[("retry-after", "2".into())]);
        assert_eq!(b.learn(&h), Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_nearly_full_shopify_bucket_slows_the_next_request() {
        let b = Budget::new(10.0);
        b.learn(&headers(&[(
            "x-shopify-shop-api-call-limit",
            "10/40".into(),
        )]));
        assert!(b.state().not_before.is_none());
        b.learn(&headers(&[(
            "x-shopify-shop-api-call-limit",
            "39/40".into(),
        )]));
        let wait = b.state().not_before.unwrap() - Instant::now();
        assert!(wait > Duration::from_millis(1500), "{wait:?}");
        assert_eq!(parse_call_limit("x/40"), None);
        assert_eq!(parse_call_limit("1/0"), None);
    }
}
