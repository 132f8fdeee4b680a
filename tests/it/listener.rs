//! The listener faces the internet (SPEC "The listener faces the internet"): attacks
//! with real sockets. Sockets bound to 127.0.0.2.. stand for other clients; the signed
//! deliveries come from 127.0.0.1 and must be answered within a second throughout.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, eventually, refund_event, sqlite_app_with_http};

/// A connection to `addr` from the client address `from`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A signed delivery from 127.0.0.1, answered 200 within a second.
async fn delivered_within_a_second(app: &TestApp, n: usize) {
    let started = Instant::now();
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(1),
        app.deliver(&refund_event(
            &format!("probe-{n}"),
            &format!("re_probe_{n}"),
        )),
    )
    .await
    .unwrap_or_else(|_| panic!("signed delivery {n} not answered within a second"));
    assert_eq!(status, 200, "{body}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// Whether the daemon closed `s` within `within` (EOF or reset; bytes it sent first,
/// such as a 408, are read past).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

async fn open_connections(app: &TestApp) -> u64 {
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    r.json::<Value>().await.unwrap()["queues"]["http_connections"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_trickling_heads_from_other_clients_never_delay_a_signed_delivery() {
    let app = sqlite_app_with_http("", "header_timeout = \"3s\"").await;
    let mut attackers = Vec::new();
    for c in 0..1000u32 {
        let from = [127, 0, 0, 2 + (c % 4) as u8];
        attackers.push(connect_from(from, app.addr).await);
    }
    // Each sends its head a byte at a time, one every 200 ms, and never finishes it.
    let head = b"POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaa";
    let trickle: Vec<_> = attackers
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                for b in head.iter().take(25) {
                    if s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                s
            })
        })
        .collect();
    for n in 0..5 {
        delivered_within_a_second(&app, n).await;
        let r = tokio::time::timeout(
            Duration::from_secs(1),
            app.client.get(app.url("/healthz")).send(),
        )
        .await
        .expect("/healthz not answered within a second")
        .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // None of them completed a head within http.header_timeout: all closed by now.
    let mut still_open = 0;
    for t in trickle {
        let mut s = t.await.unwrap();
        if !closed_within(&mut s, Duration::from_secs(4)).await {
            still_open += 1;
        }
    }
    assert_eq!(still_open, 0, "connections outlived http.header_timeout");
    assert_eq!(app.db.count("processed_events"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_bodies_hold_no_in_flight_place_and_get_408() {
    let app = sqlite_app_with_http("", "max_in_flight = 2\nbody_timeout = \"1s\"").await;
    let mut slow = Vec::new();
    for _ in 0..10 {
        let mut s = connect_from([127, 0, 0, 2], app.addr).await;
        s.write_all(
            b"POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
        )
        .await
        .unwrap();
        slow.push(s);
    }
    for n in 0..3 {
        delivered_within_a_second(&app, n).await;
    }
    for mut s in slow {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("http.body_timeout"), "{text}");
    }
    assert_eq!(app.db.count("processed_events"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_keep_alive_connections_make_room_oldest_first_at_max_connections() {
    let app = sqlite_app_with_http("", "max_in_flight = 4\nmax_connections = 40").await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut idle = Vec::new();
    for c in 0..120u32 {
        let mut s = connect_from([127, 0, 0, 2 + (c % 2) as u8], app.addr).await;
        s.write_all(request).await.unwrap();
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("a keep-alive request was not answered")
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        idle.push(s);
    }
    for n in 0..3 {
        delivered_within_a_second(&app, n).await;
    }
    assert!(open_connections(&app).await <= 40);
    // The oldest were closed to make room; the newest are still open.
    assert!(closed_within(&mut idle[0], Duration::from_secs(2)).await);
    assert!(!closed_within(&mut idle[119], Duration::from_millis(300)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_address_holds_at_most_max_connections_per_ip() {
    let app = sqlite_app_with_http("", "max_connections_per_ip = 5").await;
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(connect_from([127, 0, 0, 2], app.addr).await);
    }
    let settled = eventually(Duration::from_secs(5), || async {
        open_connections(&app).await <= 6
    })
    .await;
    assert!(settled, "one address held more than its 5 places");
    for (i, s) in held.iter_mut().enumerate() {
        let closed = closed_within(s, Duration::from_millis(if i < 15 { 2000 } else { 200 })).await;
        assert_eq!(
            closed,
            i < 15,
            "connection {i}: the oldest 15 make room, the newest 5 stay"
        );
    }
    delivered_within_a_second(&app, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_head_not_complete_within_header_timeout_is_closed_and_an_idle_keep_alive_after_idle_timeout()
 {
    let app = sqlite_app_with_http("", "header_timeout = \"1s\"\nidle_timeout = \"2s\"").await;
    let mut partial = connect_from([127, 0, 0, 2], app.addr).await;
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut partial, Duration::from_secs(5)).await);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(3),
        "closed after {took:?}, header_timeout is 1s"
    );
    // A keep-alive connection that finished its request waits idle_timeout, not
    // header_timeout, for the next one.
    let mut keep = connect_from([127, 0, 0, 2], app.addr).await;
    keep.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = keep.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let started = Instant::now();
    assert!(closed_within(&mut keep, Duration::from_secs(6)).await);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(5),
        "closed after {took:?}, idle_timeout is 2s"
    );
}

/// The HTTP/2 client preface, then an empty SETTINGS frame.
const H2C_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Whether the answer to the h2c preface is an HTTP/2 SETTINGS frame.
async fn answers_http2(app: &TestApp) -> bool {
    let mut s = TcpStream::connect(app.addr).await.unwrap();
    s.write_all(H2C_PREFACE).await.unwrap();
    let mut answer = [0u8; 9];
    match tokio::time::timeout(Duration::from_secs(3), s.read_exact(&mut answer)).await {
        // A frame header: 24-bit length, type 0x4 (SETTINGS).
        Ok(Ok(_)) => answer[3] == 0x04 && !answer.starts_with(b"HTTP/"),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http2_is_off_unless_configured() {
    let app = sqlite_app_with_http("", "").await;
    assert!(
        !answers_http2(&app).await,
        "h2c prior knowledge was served by default"
    );
    delivered_within_a_second(&app, 0).await;
    let app = sqlite_app_with_http("", "http2 = true").await;
    assert!(answers_http2(&app).await, "http2 = true serves h2c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_thousand_unsigned_requests_are_each_counted_and_logged_at_most_once_a_second() {
    use crate::helpers::process::{bin, free_port, write_migrated_config};
    let db = crate::helpers::TestDb::new(crate::helpers::Backend::Sqlite);
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let text = crate::helpers::config_toml(&db.url, "").replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let config = write_migrated_config(dir.path(), &text);
    let log = dir.path().join("serve.log");
    let mut child = bin()
        .env("RUST_LOG", "info")
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let up = eventually(Duration::from_secs(20), || async {
        client.get(format!("{base}/healthz")).send().await.is_ok()
    })
    .await;
    assert!(up, "serve did not come up");
    let started = Instant::now();
    let sent = futures_unordered_count(&client, &format!("{base}/webhooks/shop"), 3000).await;
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(sent, 3000, "every unsigned request answered 401");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics
        .lines()
        .find(|l| {
            l.starts_with("webhook_deliveries_total")
                && l.contains("result=\"unauthorized\"")
                && l.contains("source=\"shop\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(counted, Some(3000.0), "{metrics}");
    crate::helpers::process::signal(child.id(), "TERM");
    child.wait().unwrap();
    let lines = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("not authentic"))
        .count();
    let bound = seconds.ceil() as usize + 1;
    assert!(
        (1..=bound).contains(&lines),
        "{lines} log lines for 3,000 rejections in {seconds:.1}s (at most one a second)"
    );
}

/// POSTs an unsigned body `n` times (a multiple of 30), 30 at a time; returns how many
/// got 401.
async fn futures_unordered_count(client: &reqwest::Client, url: &str, n: usize) -> usize {
    let mut tasks = tokio::task::JoinSet::new();
    let per = n / 30;
    for _ in 0..30 {
        let (client, url) = (client.clone(), url.to_string());
        tasks.spawn(async move {
            let mut ok = 0;
            for _ in 0..per {
                let r = client.post(&url).body("{}").send().await.unwrap();
                ok += usize::from(r.status() == 401);
            }
            ok
        });
    }
    let mut total = 0;
    while let Some(t) = tasks.join_next().await {
        total += t.unwrap();
    }
    total
}

const ADMIN_TOKEN: &str = "admin-token-0123456789";

async fn status_of(client: &reqwest::Client, url: String, token: Option<&str>) -> u16 {
    let mut r = client.get(url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    r.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_admin_listen_the_public_listener_serves_only_webhooks_and_healthz() {
    let app = sqlite_app_with_http(
        "",
        &format!(
            "admin_listen = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN_TOKEN}\"\nchanges_token = \"pull-token-123\""
        ),
    )
    .await;
    let admin = app.admin.clone().expect("the admin listener is bound");
    let c = &app.client;
    for path in ["/readyz", "/metrics", "/changes", "/admin/status"] {
        assert_eq!(
            status_of(c, app.url(path), Some(ADMIN_TOKEN)).await,
            404,
            "public {path}"
        );
    }
    assert_eq!(status_of(c, app.url("/healthz"), None).await, 200);
    delivered_within_a_second(&app, 0).await;
    let on_admin = |p: &str| format!("http://{admin}{p}");
    assert_eq!(status_of(c, on_admin("/readyz"), None).await, 200);
    assert_eq!(status_of(c, on_admin("/metrics"), None).await, 200);
    assert_eq!(status_of(c, on_admin("/healthz"), None).await, 200);
    assert_eq!(status_of(c, on_admin("/admin/status"), None).await, 401);
    assert_eq!(
        status_of(c, on_admin("/admin/status"), Some("wrong-token-0123456")).await,
        401
    );
    assert_eq!(
        status_of(c, on_admin("/admin/status"), Some(ADMIN_TOKEN)).await,
        200
    );
    assert_eq!(
        status_of(c, on_admin("/changes"), Some("pull-token-123")).await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_admin_token_the_admin_routes_do_not_exist() {
    let app = sqlite_app_with_http("", "").await;
    assert_eq!(
        status_of(&app.client, app.url("/admin/status"), Some(ADMIN_TOKEN)).await,
        404
    );
    assert_eq!(status_of(&app.client, app.url("/readyz"), None).await, 200);
}

/// The audit's case: 2,048 connections (the default `http.max_connections`) from ten
/// addresses, each under the per-address cap, all sending a body slowly. Another client
/// still gets in: the oldest slow body of the client holding the most is closed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_bodies_from_ten_addresses_filling_the_listener_make_room_for_another_client() {
    let app = sqlite_app_with_http("", "body_timeout = \"60s\"").await;
    let head = b"POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{";
    let mut slow = Vec::new();
    for c in 0..2048u32 {
        let mut s = connect_from([127, 0, 0, 2 + (c % 10) as u8], app.addr).await;
        s.write_all(head).await.unwrap();
        slow.push(s);
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            open_connections(&app).await >= 2048
        })
        .await,
        "the slow bodies never all got in"
    );
    for n in 0..3 {
        delivered_within_a_second(&app, n).await;
    }
    assert_eq!(app.db.count("processed_events"), 3);
    let mut closed = 0;
    for s in &mut slow {
        if closed_within(s, Duration::from_millis(1)).await {
            closed += 1;
        }
    }
    assert!(
        (1..=10).contains(&closed),
        "{closed} slow bodies closed to admit 3 probes (and /readyz reads)"
    );
}

/// `http.max_body_bytes_in_flight`: bodies being received are bounded together; a new
/// one that would pass it is answered 503 before a byte of it is read, a small signed
/// delivery that fits still goes through, and the room comes back when a body ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bytes_of_bodies_being_received_are_bounded_together() {
    let app = sqlite_app_with_http(
        "",
        "max_body_bytes_in_flight = \"64KiB\"\nbody_timeout = \"2s\"",
    )
    .await;
    // One slow body declaring 60,000 bytes holds them while it trickles; a probe
    // declaring 10,000 more is refused before its body is read. (Should a probe get in
    // first, the slow body is the one refused: then both start again.)
    let slow_head = b"POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{";
    let probe_head = b"POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n";
    let read_some = |mut s: TcpStream, within: Duration| async move {
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(within, s.read(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        (String::from_utf8_lossy(&buf[..n]).to_string(), s)
    };
    let mut refused = None;
    let mut slow = None;
    for _ in 0..10 {
        let mut s = connect_from([127, 0, 0, 2], app.addr).await;
        s.write_all(slow_head).await.unwrap();
        let mut p = connect_from([127, 0, 0, 3], app.addr).await;
        p.write_all(probe_head).await.unwrap();
        let (answer, p) = read_some(p, Duration::from_millis(500)).await;
        drop(p);
        if answer.starts_with("HTTP/1.1 503") {
            refused = Some(answer);
            slow = Some(s);
            break;
        }
    }
    let (refused, mut slow) = (refused.expect("no probe was refused"), slow.unwrap());
    assert!(refused.contains("max_body_bytes_in_flight"), "{refused}");
    delivered_within_a_second(&app, 0).await;
    // The slow body ends (408 at http.body_timeout): its room is back.
    assert!(closed_within(&mut slow, Duration::from_secs(5)).await);
    let mut s = connect_from([127, 0, 0, 3], app.addr).await;
    let body = "x".repeat(10_000);
    s.write_all(format!("POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(
        text.starts_with("HTTP/1.1 401"),
        "read, then refused as unsigned: {text}"
    );
}
