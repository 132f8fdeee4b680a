//! A simulated sender: a real HTTP server on 127.0.0.1 that owns resources of a few
//! kinds and serves their list and get endpoints in the three pagination styles, with
//! the faults real senders have (5xx, 429 with Retry-After, malformed pages). Used by
//! the tests, the benchmarks and the demo.
//!
//! It is the *sender's* side, not ours: it uses axum for its own server like any
//! sender would, apart from the daemon's `http` module.

pub mod deliver;
mod generated;
pub mod providers;

pub use generated::Generated;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// How a kind's listing is paginated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Cursor,
    Link,
    Stripe,
}

/// One resource as the sender holds it.
#[derive(Debug, Clone)]
pub struct Item {
    pub version: i64,
    /// Extra fields of the item (merged with `id` and `version` when served).
    pub fields: Value,
    /// Served exactly as this instead (a malformed item), when set.
    pub raw: Option<Value>,
}

enum Listing {
    Stored(BTreeMap<String, Item>),
    Generated(Generated),
}

/// A fault to answer instead of the page.
#[derive(Debug, Clone)]
pub enum Fault {
    /// This status, with `Retry-After` seconds if given.
    Status(u16, Option<u64>),
    /// 200 with a body that is not a page.
    Malformed,
}

/// A listing that misbehaves the way a broken or hostile sender's does.
#[derive(Debug, Clone)]
pub enum Quirk {
    /// Link style: the next link carries a comma in its query (`fields=id,version`), sits
    /// among other links with `rel` lists, and a second `Link` header is sent too.
    AwkwardLinks,
    /// Link style: the next link points to this other base URL (another origin).
    ForeignNext(String),
    /// Link style: the next link is the URL just requested.
    SelfLink,
    /// Cursor style: `next_cursor` never advances; every page is the first.
    StuckCursor,
    /// Stripe style: `has_more` stays true and every page is the first.
    StuckHasMore,
    /// Every page carries a field of this many bytes.
    Padding(usize),
    /// Every list request is answered with a redirect to the same path and query on
    /// this other base URL.
    RedirectTo(String),
    /// List request number `n` (1-based, all kinds) is answered after `delay`.
    SlowRequest { n: u64, delay: std::time::Duration },
    /// Every list and get request is answered with this fault, until cleared (an
    /// outage, a rate limit that lasts).
    Outage(Fault),
    /// Every list and get request is answered after this delay, until cleared.
    Slow(std::time::Duration),
}

/// The outage and the delay the quirks put on every request.
fn standing_faults(quirks: &[Quirk]) -> (Option<Fault>, Option<std::time::Duration>) {
    let outage = quirks.iter().find_map(|q| match q {
        Quirk::Outage(f) => Some(f.clone()),
        _ => None,
    });
    let slow = quirks.iter().find_map(|q| match q {
        Quirk::Slow(d) => Some(*d),
        _ => None,
    });
    (outage, slow)
}

#[derive(Default)]
struct World {
    kinds: HashMap<String, (Style, Listing)>,
    quirks: Vec<Quirk>,
    /// The `Authorization` header of every request, in order (`None`: absent).
    authorizations: Vec<Option<String>>,
    /// Faults by the number of the list request they answer (1-based, all kinds).
    faults: BTreeMap<u64, Fault>,
    list_requests: u64,
    get_requests: u64,
    /// The id of every get request, as the server decoded it from the path.
    get_paths: Vec<String>,
}

/// The running simulated sender. Dropping it stops the server.
pub struct SimSender {
    pub addr: SocketAddr,
    world: Arc<Mutex<World>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for SimSender {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock(world: &Mutex<World>) -> std::sync::MutexGuard<'_, World> {
    // A panic while holding the lock would be a bug in this module; the data is still
    // usable for a simulator.
    world.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimSender {
    /// Starts serving on 127.0.0.1, on a free port.
    pub async fn start() -> std::io::Result<SimSender> {
        let world = Arc::new(Mutex::new(World::default()));
        let app = Router::new()
            .route("/{kind}", get(list))
            .route("/{kind}/{id}", get(get_one))
            .with_state(world.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(SimSender {
            addr,
            world,
            server,
        })
    }

    /// `http://127.0.0.1:PORT`, the `api_base` to configure.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Declares a kind with stored items, served in `style`.
    pub fn add_kind(&self, kind: &str, style: Style) {
        lock(&self.world)
            .kinds
            .insert(kind.into(), (style, Listing::Stored(BTreeMap::new())));
    }

    /// Declares a kind whose items are computed, served in `style`.
    pub fn add_generated_kind(&self, kind: &str, style: Style, generated: Generated) {
        lock(&self.world)
            .kinds
            .insert(kind.into(), (style, Listing::Generated(generated)));
    }

    /// Creates or replaces a stored item.
    pub fn put(&self, kind: &str, id: &str, version: i64, fields: Value) {
        if let Some((_, Listing::Stored(items))) = lock(&self.world).kinds.get_mut(kind) {
            items.insert(
                id.into(),
                Item {
                    version,
                    fields,
                    raw: None,
                },
            );
        }
    }

    /// Creates or replaces a stored item served exactly as `served` (for items a
    /// careless sender gets wrong: a version that is not a number, a missing id...).
    pub fn put_raw(&self, kind: &str, id: &str, served: Value) {
        if let Some((_, Listing::Stored(items))) = lock(&self.world).kinds.get_mut(kind) {
            items.insert(
                id.into(),
                Item {
                    version: 0,
                    fields: Value::Null,
                    raw: Some(served),
                },
            );
        }
    }

    /// Removes a stored item (the sender deleted it).
    pub fn remove(&self, kind: &str, id: &str) {
        if let Some((_, Listing::Stored(items))) = lock(&self.world).kinds.get_mut(kind) {
            items.remove(id);
        }
    }

    /// The item as served: `{"id", "version", ...fields}`.
    pub fn item_json(id: &str, item: &Item) -> Value {
        if let Some(raw) = &item.raw {
            return raw.clone();
        }
        let mut v = json!({"id": id, "version": item.version});
        if let (Some(obj), Some(fields)) = (v.as_object_mut(), item.fields.as_object()) {
            for (k, f) in fields {
                obj.insert(k.clone(), f.clone());
            }
        }
        v
    }

    /// A stored kind's items as served, by id.
    pub fn items(&self, kind: &str) -> BTreeMap<String, Value> {
        match lock(&self.world).kinds.get(kind) {
            Some((_, Listing::Stored(items))) => items
                .iter()
                .map(|(id, it)| (id.clone(), Self::item_json(id, it)))
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// Answers list request number `n` (1-based, counting all kinds) with `fault`.
    pub fn fail_list_request(&self, n: u64, fault: Fault) {
        lock(&self.world).faults.insert(n, fault);
    }

    /// Makes the listing misbehave (see [`Quirk`]); several may be combined.
    pub fn add_quirk(&self, quirk: Quirk) {
        lock(&self.world).quirks.push(quirk);
    }

    /// Stops every misbehaviour: the sender is fixed.
    pub fn clear_quirks(&self) {
        lock(&self.world).quirks.clear();
    }

    /// The `Authorization` header of every request received, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        lock(&self.world).authorizations.clone()
    }

    /// List requests served so far (faults included).
    pub fn list_requests(&self) -> u64 {
        lock(&self.world).list_requests
    }

    pub fn get_requests(&self) -> u64 {
        lock(&self.world).get_requests
    }

    /// The ids of the get requests received, as decoded from their paths.
    pub fn get_ids(&self) -> Vec<String> {
        lock(&self.world).get_paths.clone()
    }
}

fn fault_response(fault: Fault) -> Response {
    match fault {
        Fault::Status(code, retry_after) => {
            let mut r = (
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                axum::Json(json!({"error": "simulated fault"})),
            )
                .into_response();
            if let Some(secs) = retry_after {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            r
        }
        Fault::Malformed => (StatusCode::OK, "<html>upstream proxy error</html>").into_response(),
    }
}

fn authorization(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

async fn list(
    State(world): State<Arc<Mutex<World>>>,
    Path(kind): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let delay = {
        let mut w = lock(&world);
        w.list_requests += 1;
        w.authorizations.push(authorization(&headers));
        let n = w.list_requests;
        let redirect = w.quirks.iter().find_map(|q| match q {
            Quirk::RedirectTo(base) => Some(base.clone()),
            _ => None,
        });
        if let Some(base) = redirect {
            return axum::response::Redirect::temporary(&format!("{base}{uri}")).into_response();
        }
        let (outage, slow) = standing_faults(&w.quirks);
        let once = w.quirks.iter().find_map(|q| match q {
            Quirk::SlowRequest { n: slow, delay } if *slow == n => Some(*delay),
            _ => None,
        });
        (outage, once.or(slow))
    };
    let (outage, delay) = delay;
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    if let Some(fault) = outage {
        return fault_response(fault);
    }
    list_page(&world, &kind, &q, &uri, &headers)
}

fn list_page(
    world: &Mutex<World>,
    kind: &str,
    q: &HashMap<String, String>,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
) -> Response {
    let w = &mut *lock(world);
    let n = w.list_requests;
    if let Some(fault) = w.faults.remove(&n) {
        return fault_response(fault);
    }
    let quirks = w.quirks.clone();
    let has = |f: fn(&Quirk) -> bool| quirks.iter().any(f);
    let stuck = has(|q| matches!(q, Quirk::StuckCursor | Quirk::StuckHasMore));
    let Some((style, listing)) = w.kinds.get(kind) else {
        return (StatusCode::NOT_FOUND, "no such kind").into_response();
    };
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(100)
        .clamp(1, 10_000);
    // Every style pages by id order; they differ only in how "after" is carried.
    let after = match style {
        Style::Cursor => q.get("cursor"),
        Style::Link => q.get("after"),
        Style::Stripe => q.get("starting_after"),
    }
    .cloned()
    // A stuck sender serves the first page whatever the position says.
    .filter(|_| !stuck);
    let since = q
        .get("updated_since")
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
    // Like real senders, an unknown cursor is refused (it expired, or never existed).
    if let (Listing::Stored(stored), Some(a)) = (listing, after.as_deref()) {
        if !stored.contains_key(a) {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": "cursor expired"})),
            )
                .into_response();
        }
    }
    if let (Listing::Generated(g), Style::Cursor, false) =
        (listing, style, has(|q| matches!(q, Quirk::Padding(_))))
    {
        return generated_cursor_page(g, after.as_deref(), limit, stuck);
    }
    let (items, more) = page_of(listing, after.as_deref(), limit, since);
    // A stuck sender always says more pages follow.
    let more = more || stuck;
    let last = items
        .last()
        .and_then(|v| v.get("id"))
        .and_then(Value::as_str)
        .map(String::from);
    let style = *style;
    let padding = quirks.iter().find_map(|q| match q {
        Quirk::Padding(n) => Some("x".repeat(*n)),
        _ => None,
    });
    let mut body = match style {
        Style::Cursor => json!({
            "data": items,
            "next_cursor": if more { last.clone().map(Value::from).unwrap_or(Value::Null) } else { Value::Null },
        }),
        Style::Stripe => json!({"object": "list", "data": items, "has_more": more}),
        Style::Link => json!({"data": items}),
    };
    if let (Some(p), Some(obj)) = (padding, body.as_object_mut()) {
        obj.insert("padding".into(), Value::from(p));
    }
    let mut r = axum::Json(body).into_response();
    if style == Style::Link {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        let base = quirks
            .iter()
            .find_map(|q| match q {
                Quirk::ForeignNext(other) => Some(other.clone()),
                _ => None,
            })
            .unwrap_or_else(|| format!("http://{host}"));
        let mut links: Vec<String> = Vec::new();
        if let (true, Some(last)) = (more, last) {
            if has(|q| matches!(q, Quirk::SelfLink)) {
                links.push(format!("<http://{host}{uri}>; rel=\"next\""));
            } else if has(|q| matches!(q, Quirk::AwkwardLinks)) {
                links.push(format!(
                    "<{base}/{kind}?limit={limit}>; rel=\"first\", <{base}/{kind}?limit={limit}&after={last}&fields=id,version>; rel=\"last NEXT\"; title=\"page, next\""
                ));
                links.push(format!(
                    "<{base}/{kind}?limit={limit}&fields=id,version>; rel=\"start\""
                ));
            } else {
                links.push(format!(
                    "<{base}/{kind}?limit={limit}&after={last}>; rel=\"next\""
                ));
            }
        }
        for link in links {
            if let Ok(v) = HeaderValue::from_str(&link) {
                r.headers_mut().append(header::LINK, v);
            }
        }
    }
    r
}

/// A generated listing's cursor page written straight into its body, as `list_page`
/// would serialise it: the bench's sender serves millions of items on the cores the
/// reconciler and the database share, and building each as a tree cost it a core.
fn generated_cursor_page(
    g: &Generated,
    after: Option<&str>,
    limit: usize,
    stuck: bool,
) -> Response {
    let start = after.and_then(Generated::index_of).map_or(0, |i| i + 1);
    let end = (start + limit as u64).min(g.count);
    let mut body = String::with_capacity(64 + 240 * end.saturating_sub(start) as usize);
    body.push_str(r#"{"data":["#);
    for i in start..end {
        if i > start {
            body.push(',');
        }
        Generated::write_item(&mut body, i, (g.version_of)(i));
    }
    body.push_str(r#"],"next_cursor":"#);
    if (end < g.count || stuck) && end > start {
        body.push('"');
        body.push_str(&Generated::id_of(end - 1));
        body.push('"');
    } else {
        body.push_str("null");
    }
    body.push('}');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An item's `updated_at` field, for `?updated_since=` filtering.
fn updated_at(item: &Item) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    item.fields
        .get("updated_at")
        .and_then(Value::as_str)
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
}

fn page_of(
    listing: &Listing,
    after: Option<&str>,
    limit: usize,
    since: Option<chrono::DateTime<chrono::FixedOffset>>,
) -> (Vec<Value>, bool) {
    match listing {
        Listing::Stored(items) => {
            let iter: Box<dyn Iterator<Item = (&String, &Item)>> =
                match after {
                    Some(a) => Box::new(items.range::<str, _>((
                        std::ops::Bound::Excluded(a),
                        std::ops::Bound::Unbounded,
                    ))),
                    None => Box::new(items.iter()),
                };
            let mut iter = iter.filter(|(_, it)| match since {
                Some(since) => updated_at(it).is_some_and(|u| u >= since),
                None => true,
            });
            let page: Vec<Value> = iter
                .by_ref()
                .take(limit)
                .map(|(id, it)| SimSender::item_json(id, it))
                .collect();
            let more = iter.next().is_some();
            (page, more)
        }
        Listing::Generated(g) => {
            let start = after.and_then(Generated::index_of).map_or(0, |i| i + 1);
            let end = (start + limit as u64).min(g.count);
            let page = (start..end)
                .map(|i| Generated::item(i, (g.version_of)(i)))
                .collect();
            (page, end < g.count)
        }
    }
}

async fn get_one(
    State(world): State<Arc<Mutex<World>>>,
    Path((kind, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let (outage, slow) = {
        let mut w = lock(&world);
        w.get_requests += 1;
        w.authorizations.push(authorization(&headers));
        w.get_paths.push(id.clone());
        standing_faults(&w.quirks)
    };
    if let Some(delay) = slow {
        tokio::time::sleep(delay).await;
    }
    if let Some(fault) = outage {
        return fault_response(fault);
    }
    let w = lock(&world);
    match w.kinds.get(&kind) {
        Some((_, Listing::Stored(items))) => match items.get(&id) {
            Some(item) => axum::Json(SimSender::item_json(&id, item)).into_response(),
            None => (StatusCode::NOT_FOUND, "no such item").into_response(),
        },
        _ => (StatusCode::NOT_FOUND, "no such kind").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The written page is the page `list_page` serialises for any other listing.
    #[tokio::test]
    async fn generated_cursor_page_is_the_serialised_page() {
        let g = Generated {
            count: 2_500,
            version_of: Arc::new(|i| if i % 200 == 100 { 2 } else { 1 }),
        };
        let listing = Listing::Generated(g.clone());
        for (after, stuck) in [
            (None, false),
            (Some("g0000000999"), false),
            (Some("g0000001999"), false),
            (Some("g0000002499"), false),
            (Some("g0000001999"), true),
        ] {
            let resp = generated_cursor_page(&g, after, 1000, stuck);
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            let (items, more) = page_of(&listing, after, 1000, None);
            let last = items.last().and_then(|v| v.get("id")).cloned();
            let want = json!({
                "data": items,
                "next_cursor": if more || stuck { last.unwrap_or(Value::Null) } else { Value::Null },
            });
            assert_eq!(
                std::str::from_utf8(&body).unwrap(),
                want.to_string(),
                "after {after:?}"
            );
        }
    }
}
