//! The event ids this process has seen claimed in the database, so that a sender's
//! retry of a delivery already committed is answered `duplicate` without a
//! transaction. Senders retry whatever was not acknowledged in time, and a retry costs
//! the database as much as its original did (a claim that finds the id taken, in a
//! transaction of its own). The answer is the one the database would give: only ids
//! this process claimed are kept (their claims committed), and for half the time their
//! claims are kept (`sources.NAME.retention`, twice the retry window by default), so
//! retention cannot have pruned a claim whose id is still here, whatever the clocks.
//!
//! Bounded, oldest first out, in two generations: ids go into the current set; when it
//! holds `generation` ids it becomes the previous one (the one before is dropped), so
//! the newest `generation` to `2 × generation` ids are kept. An id is looked up by the
//! few retries of one event, not read over and over, so a cache's admission policy
//! (S3-FIFO, TinyLFU) would drop it before its retry came. Sets that are only ever
//! added to and then dropped whole never fill with the tombstones that removing ids one
//! by one leaves in a hash table (which grew one to four times its ids' size). An id
//! is kept as a keyed 128-bit hash (16 bytes, not the string): the keys are random per
//! process, so no sender can choose two ids that collide, and two ids of one process
//! colliding by chance is as likely as two SHA-256 body digests doing so. An id not
//! here is simply claimed in the database as before, so the set only ever saves work.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Ids per generation: 7/8 of 32,768, the most a hash table of 32,768 slots holds. The
/// newest 28,672 to 57,344 ids are kept: 1.06 MiB a source once both generations are
/// full, 1.33 MiB at most while the current one grows (allocations counted over 20
/// generations of inserts).
pub const GENERATION: usize = 28_672;

/// An event id's keyed 128-bit hash.
type IdKey = [u64; 2];

pub struct RecentClaims {
    keys: (RandomState, RandomState),
    generation: usize,
    /// How long an id is kept: half its claim's retention.
    ttl: Duration,
    inner: Mutex<Inner>,
}

struct Generation {
    ids: HashSet<IdKey>,
    /// Every id in it was claimed at or after this.
    since: Instant,
}

impl Generation {
    fn new(since: Instant) -> Self {
        Self {
            ids: HashSet::new(),
            since,
        }
    }
}

struct Inner {
    current: Generation,
    previous: Option<Generation>,
}

impl Inner {
    /// Drops a generation that may hold an id older than `ttl`.
    fn expire(&mut self, now: Instant, ttl: Duration) {
        if self
            .previous
            .as_ref()
            .is_some_and(|p| now.duration_since(p.since) >= ttl)
        {
            self.previous = None;
        }
        if now.duration_since(self.current.since) >= ttl {
            self.previous = None;
            self.current = Generation::new(now);
        }
    }
}

impl RecentClaims {
    /// Keeps the newest `generation` to `2 × generation` ids, each for at most half of
    /// `claim_retention`.
    pub fn new(generation: usize, claim_retention: Duration) -> Self {
        Self {
            keys: (RandomState::new(), RandomState::new()),
            generation,
            ttl: claim_retention / 2,
            inner: Mutex::new(Inner {
                current: Generation::new(Instant::now()),
                previous: None,
            }),
        }
    }

    fn key(&self, event_id: &str) -> IdKey {
        [
            self.keys.0.hash_one(event_id),
            self.keys.1.hash_one(event_id),
        ]
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held(inner: &Inner, key: &IdKey) -> bool {
        inner.current.ids.contains(key)
            || inner.previous.as_ref().is_some_and(|p| p.ids.contains(key))
    }

    /// Whether `event_id`'s claim was seen committed.
    pub fn contains(&self, event_id: &str) -> bool {
        if self.generation == 0 {
            return false;
        }
        let key = self.key(event_id);
        let mut inner = self.inner();
        inner.expire(Instant::now(), self.ttl);
        Self::held(&inner, &key)
    }

    /// Records that this process's transaction claimed `event_id` and committed. Not
    /// for an id the database answered `duplicate`: its claim may be older than this
    /// process knows, and closer to being pruned.
    pub fn insert(&self, event_id: &str) {
        if self.generation == 0 {
            return;
        }
        let key = self.key(event_id);
        let now = Instant::now();
        let mut inner = self.inner();
        inner.expire(now, self.ttl);
        if Self::held(&inner, &key) {
            return;
        }
        if inner.current.ids.len() >= self.generation {
            let full = std::mem::replace(&mut inner.current, Generation::new(now));
            inner.previous = Some(full);
        }
        inner.current.ids.insert(key);
    }

    pub fn len(&self) -> usize {
        let inner = self.inner();
        inner.current.ids.len() + inner.previous.as_ref().map_or(0, |p| p.ids.len())
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
    fn keeps_the_newest_ids_in_two_generations() {
        let recent = RecentClaims::new(2, DAY);
        for id in ["evt_1", "evt_2", "evt_3", "evt_2", "evt_4"] {
            recent.insert(id);
        }
        assert_eq!(recent.len(), 4, "a repeated id is kept once");
        for id in ["evt_1", "evt_2", "evt_3", "evt_4"] {
            assert!(recent.contains(id), "{id}");
        }
        recent.insert("evt_5");
        assert_eq!(recent.len(), 3, "the oldest generation went");
        assert!(!recent.contains("evt_1") && !recent.contains("evt_2"));
        for id in ["evt_3", "evt_4", "evt_5"] {
            assert!(recent.contains(id), "{id}");
        }
        assert!(!recent.contains("evt_6"));
        assert!(!recent.contains("evt_"), "a prefix is another id");
    }

    #[test]
    fn a_generation_of_zero_keeps_nothing() {
        let recent = RecentClaims::new(0, DAY);
        recent.insert("evt_1");
        assert!(!recent.contains("evt_1"));
        assert!(recent.is_empty());
    }

    #[test]
    fn an_id_is_forgotten_within_half_its_claims_retention() {
        let recent = RecentClaims::new(10, Duration::from_secs(2));
        recent.insert("evt_1");
        let inserted = Instant::now();
        assert!(recent.contains("evt_1"));
        while recent.contains("evt_1") {
            assert!(
                inserted.elapsed() < Duration::from_millis(1500),
                "kept longer than half the retention"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(recent.is_empty());
    }
}
