//! The listener's caps, on its registry alone (the same with real sockets:
//! `tests/it/listener.rs`).

use super::*;

fn v6(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn an_ipv6_client_is_its_64_and_a_mapped_ipv4_its_address() {
    assert_eq!(client_of(v6("2001:db8:1:2:aaaa::1")), v6("2001:db8:1:2::"));
    assert_eq!(
        client_of(v6("2001:db8:1:2:ffff:ffff:ffff:ffff")),
        v6("2001:db8:1:2::")
    );
    assert_ne!(client_of(v6("2001:db8:1:3::1")), v6("2001:db8:1:2::"));
    assert_eq!(client_of(v6("::ffff:192.0.2.7")), v6("192.0.2.7"));
    assert_eq!(client_of(v6("192.0.2.7")), v6("192.0.2.7"));
}

#[test]
fn one_64_is_one_client_under_the_per_client_cap() {
    let registry = Arc::new(Registry::new(0, 3));
    let mut held = Vec::new();
    for n in 1..=3 {
        let ip = client_of(v6(&format!("2001:db8:0:1::{n:x}")));
        let slot = registry.admit(ip).expect("under the cap");
        // In a request (not evictable), as a slow body would be.
        slot.conn.requests.fetch_add(1, Ordering::AcqRel);
        held.push(slot);
    }
    // A fourth address of the same /64 is the same client: at its cap.
    assert!(
        registry
            .admit(client_of(v6("2001:db8:0:1::ffff")))
            .is_none()
    );
    // Another /64 is another client.
    assert!(registry.admit(client_of(v6("2001:db8:0:2::1"))).is_some());
}

#[test]
fn at_the_total_cap_the_oldest_slow_body_of_the_biggest_client_makes_room() {
    let registry = Arc::new(Registry::new(5, 0));
    let (a, b) = (v6("192.0.2.1"), v6("192.0.2.2"));
    let mut held = Vec::new();
    for ip in [b, a, a, a, b] {
        let slot = registry.admit(ip).unwrap();
        slot.conn.requests.fetch_add(1, Ordering::AcqRel);
        slot.conn.receiving.fetch_add(1, Ordering::AcqRel);
        held.push(slot);
    }
    // Full, every connection in a request: `a` holds the most; its oldest goes.
    let probe = registry.admit(v6("192.0.2.3")).expect("room made");
    probe.conn.requests.fetch_add(1, Ordering::AcqRel);
    let evicted: Vec<bool> = held.iter().map(|s| s.conn.evict.is_cancelled()).collect();
    assert_eq!(evicted, [false, true, false, false, false]);
    // A connection past its body (being answered) is never taken.
    for s in &held {
        s.conn.receiving.store(0, Ordering::Release);
    }
    assert!(registry.admit(v6("192.0.2.4")).is_none());
}
