//! The event ids this process has seen claimed in the database, so that a sender's
//! retry of a delivery already committed is answered `duplicate` without a
//! transaction. Senders retry whatever was not acknowledged in time, and a retry costs
//! the database as much as its original did (a claim that finds the id taken, in a
//! transaction of its own). The answer is the one the database would give: only ids
//! this process claimed are kept (their claims committed), and for half the time their
//! claims are kept (`sources.NAME.retention`, twice the retry window by default), so
//! retention cannot have pruned a claim whose id is still here, whatever the clocks.
//!
//! Bounded, first in first out: an id is looked up by the few retries of one event,
//! not read over and over, so a cache's admission policy (S3-FIFO, TinyLFU) would drop
//! it before its retry came; the oldest ids go first instead. An id is kept as a keyed
//! 128-bit hash (16 bytes, not the string): the key is random per process, so no sender
//! can choose two ids that collide, and two ids of one process colliding by chance is
//! as likely as two SHA-256 body digests doing so. An id not here is simply claimed in
//! the database as before, so the set only ever saves work.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ids kept per source: ~35 bytes each once full (2.3 MiB), a minute of retries at
/// 1,000 deliveries a second.
pub const CAPACITY: usize = 65_536;

pub struct RecentClaims {
    keys: (RandomState, RandomState),
    capacity: usize,
    /// How long an id is kept: half its claim's retention.
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    ids: HashSet<u128>,
    /// Oldest first, with when each was claimed.
    order: VecDeque<(u128, Instant)>,
}

impl Inner {
    fn forget(&mut self, now: Instant, ttl: Duration, capacity: usize) {
        while let Some(&(key, at)) = self.order.front() {
            if self.order.len() <= capacity && now.duration_since(at) < ttl {
                break;
            }
            self.order.pop_front();
            self.ids.remove(&key);
        }
    }
}

impl RecentClaims {
    /// Keeps up to `capacity` ids, each for half of `claim_retention`.
    pub fn new(capacity: usize, claim_retention: Duration) -> Self {
        Self {
            keys: (RandomState::new(), RandomState::new()),
            capacity,
            ttl: claim_retention / 2,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn key(&self, event_id: &str) -> u128 {
        let hi = self.keys.0.hash_one(event_id);
        let lo = self.keys.1.hash_one(event_id);
        (u128::from(hi) << 64) | u128::from(lo)
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `event_id`'s claim was seen committed.
    pub fn contains(&self, event_id: &str) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let key = self.key(event_id);
        let mut inner = self.inner();
        inner.forget(Instant::now(), self.ttl, self.capacity);
        inner.ids.contains(&key)
    }

    /// Records that this process's transaction claimed `event_id` and committed. Not
    /// for an id the database answered `duplicate`: its claim may be older than this
    /// process knows, and closer to being pruned.
    pub fn insert(&self, event_id: &str) {
        if self.capacity == 0 {
            return;
        }
        let key = self.key(event_id);
        let now = Instant::now();
        let mut inner = self.inner();
        if inner.ids.insert(key) {
            inner.order.push_back((key, now));
        }
        inner.forget(now, self.ttl, self.capacity);
    }

    pub fn len(&self) -> usize {
        self.inner().order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn keeps_the_newest_ids_up_to_its_capacity() {
        let recent = RecentClaims::new(3, DAY);
        for id in ["evt_1", "evt_2", "evt_3", "evt_2", "evt_4"] {
            recent.insert(id);
        }
        assert_eq!(recent.len(), 3, "a repeated id is kept once");
        assert!(!recent.contains("evt_1"), "the oldest id went first");
        for id in ["evt_2", "evt_3", "evt_4"] {
            assert!(recent.contains(id), "{id}");
        }
        assert!(!recent.contains("evt_5"));
        assert!(!recent.contains("evt_"), "a prefix is another id");
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let recent = RecentClaims::new(0, DAY);
        recent.insert("evt_1");
        assert!(!recent.contains("evt_1"));
        assert!(recent.is_empty());
    }

    #[test]
    fn an_id_is_forgotten_after_half_its_claims_retention() {
        let recent = RecentClaims::new(10, Duration::from_secs(2));
        recent.insert("evt_1");
        assert!(recent.contains("evt_1"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while recent.contains("evt_1") {
            assert!(Instant::now() < deadline, "still kept after 5 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(recent.is_empty());
    }
}
