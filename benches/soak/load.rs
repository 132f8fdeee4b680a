//! The soak's sender: random orders of the simulated sender move to their next version,
//! each change is delivered signed; ~10% twice, ~5% held back and delivered later
//! (reordered), ~2% never (left to the reconcile). A delivery not answered 2xx is
//! delivered again a second later, as a real sender retries.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use serde_json::json;
use webhook_reconciler::signature as sign;
use webhook_reconciler::simulator::SimSender;

pub const SECRET: &str = "soak-secret";
pub const ORDERS: usize = 2000;

/// What the load saw; shared with the report.
#[derive(Default)]
pub struct Seen {
    /// The current version of every order at the sender (0: never changed).
    pub versions: Vec<i64>,
    /// Event ids answered 2xx.
    pub delivered: HashSet<String>,
    /// (seconds since the start, latency ms) of every delivery answered 2xx.
    pub latencies: Vec<(f64, f64)>,
    /// Seconds since the start of every 2xx answer, latest last.
    pub last_ok: f64,
    /// Deliveries answered otherwise (and retried), by status (0: no answer).
    pub refused: std::collections::BTreeMap<u16, u64>,
}

pub fn signed(client: &reqwest::Client, url: &str, body: String) -> reqwest::RequestBuilder {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let sig = sign::hmac_sha256(SECRET.as_bytes(), ts, body.as_bytes());
    client
        .post(url)
        .header("X-Signature", sig)
        .header("X-Signature-Timestamp", ts.to_string())
        .body(body)
}

/// Runs the load until `deadline`; then delivers what is still waiting for a retry.
pub async fn run(
    sim: &SimSender,
    client: reqwest::Client,
    url: String,
    rate: f64,
    started: Instant,
    deadline: Instant,
    seen: Arc<Mutex<Seen>>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut held: Vec<String> = Vec::new();
    let retry: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    seen.lock().unwrap().versions = vec![0; ORDERS];
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        tick.tick().await;
        let now = Instant::now();
        let mut sends = Vec::new();
        {
            let mut r = retry.lock().unwrap();
            let (due, later): (Vec<_>, Vec<_>) = r.drain(..).partition(|(at, _)| *at <= now);
            *r = later;
            sends.extend(due.into_iter().map(|(_, b)| b));
        }
        if now < deadline {
            let order = rng.random_range(0..ORDERS);
            let version = {
                let mut s = seen.lock().unwrap();
                s.versions[order] += 1;
                s.versions[order]
            };
            let id = format!("ord_{order:05}");
            let status = format!("s{}", version % 7);
            sim.put("orders", &id, version, json!({"status": status}));
            let body = json!({"id": format!("evt_{id}_{version}"), "type": "order.updated",
                "data": {"id": id, "version": version, "status": status}})
            .to_string();
            let roll: f64 = rng.random();
            if roll < 0.02 {
                // Lost: the reconcile repairs it.
            } else if roll < 0.07 {
                held.push(body);
            } else {
                sends.push(body.clone());
                if roll < 0.17 {
                    sends.push(body);
                }
            }
            if held.len() > 20 {
                sends.append(&mut held);
            }
        } else {
            sends.append(&mut held);
            if sends.is_empty() && retry.lock().unwrap().is_empty() && in_flight.is_empty() {
                return;
            }
            if now > deadline + Duration::from_secs(120) {
                eprintln!("soak: deliveries still refused two minutes after the load ended");
                return;
            }
        }
        while in_flight.try_join_next().is_some() {}
        for body in sends {
            let (request, seen, retry) = (
                signed(&client, &url, body.clone()),
                seen.clone(),
                retry.clone(),
            );
            in_flight.spawn(async move {
                let t = Instant::now();
                let status = match request.timeout(Duration::from_secs(30)).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                };
                let mut s = seen.lock().unwrap();
                if (200..300).contains(&status) {
                    let at = t.duration_since(started).as_secs_f64();
                    s.latencies.push((at, t.elapsed().as_secs_f64() * 1000.0));
                    s.last_ok = s.last_ok.max(at);
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    s.delivered.insert(v["id"].as_str().unwrap().to_string());
                } else {
                    *s.refused.entry(status).or_default() += 1;
                    retry
                        .lock()
                        .unwrap()
                        .push((Instant::now() + Duration::from_secs(1), body));
                }
            });
        }
    }
}
