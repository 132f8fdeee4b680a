//! The first two stages of a sweep, each on its own task: the fetcher pages through
//! the sender's listing, the reader reads a page's items into changes and reads their
//! local rows. The writer (`sweep`) compares and writes in page order.

use super::progress::ProgressGuard;
use super::{RunError, item_pointers};
use crate::change::scan::{self, Json};
use crate::change::{Change, Key};
use crate::config::{KindConfig, Listing};
use crate::sender::Next;
use crate::store::StoredRow;

/// The fetcher stage: pages through the listing from `at`, each page checked by the
/// progress guard before the next is requested; stops at the last page, at the first
/// error (sent on), or when the run stops listening.
pub(super) async fn fetch_pages(
    sender: crate::sender::Sender,
    kind: KindConfig,
    filter: Option<(String, String)>,
    mut at: Option<Next>,
    out: tokio::sync::mpsc::Sender<Result<crate::sender::Page, RunError>>,
) {
    let mut guard = ProgressGuard::new(at.as_ref());
    loop {
        let f = filter.as_ref().map(|(p, v)| (p.as_str(), v.as_str()));
        let fetched = sender
            .list_page(&kind, at.as_ref(), f)
            .await
            .map_err(RunError::from)
            // Checked before the next page is even requested, and before this page's
            // position could be saved.
            .and_then(|page| guard.visit(&page.url, page.next.as_ref()).map(|()| page));
        let next = fetched.as_ref().ok().and_then(|p| p.next.clone());
        let failed = fetched.is_err();
        if out.send(fetched).await.is_err() || failed || next.is_none() {
            return;
        }
        at = next;
    }
}

/// The reader stage: a page's items read into changes (on this task, off the writer),
/// and the local rows of their ids. The catch-up's events are passed on as they are.
pub(super) async fn read_page(
    store: &crate::store::Store,
    key: &Key,
    kind: &KindConfig,
    page: crate::sender::Page,
    ranges: std::sync::Arc<crate::store::RangeReads>,
) -> Result<ReadPage, RunError> {
    if kind.listing == Listing::Events {
        return Ok((page, Vec::new(), Vec::new(), (0.0, 0.0)));
    }
    let started = std::time::Instant::now();
    let read = read_items(key, kind, &page.items, page.date).map_err(|reason| {
        crate::sender::SenderError::BadPage {
            url: page.url.clone(),
            reason,
        }
    })?;
    let read_seconds = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let ids: Vec<String> = read
        .iter()
        .filter_map(|r| match r {
            ReadItem::Read { change, .. } => Some(change.id.clone()),
            ReadItem::Unreadable { .. } | ReadItem::Excluded => None,
        })
        .collect();
    let local = store.stored_rows_of_page(key, ids, ranges).await?;
    Ok((
        page,
        read,
        local,
        (read_seconds, started.elapsed().as_secs_f64()),
    ))
}

/// A page as the reader hands it to the writer: its items read, their local rows, and
/// the seconds the reading of items and of local rows took.
pub(super) type ReadPage = (
    crate::sender::Page,
    Vec<ReadItem>,
    Vec<StoredRow>,
    (f64, f64),
);

/// A listed item, read by the reader stage.
pub(super) enum ReadItem {
    Read {
        index: usize,
        change: Change,
        /// The item's last-modified time, for an incremental kind's watermark.
        modified: Option<i64>,
    },
    Unreadable {
        index: usize,
        id: Option<String>,
        reason: String,
    },
    /// Not of this kind (the kind's `exclude` pointer is present): left out, and not
    /// seen, so a row of it stored earlier is a deletion candidate.
    Excluded,
}

/// Reads a page's items with the kind's pointers (versioned by the response's `date`
/// for a kind versioned by fetch time): the items' array in one pass (`change::scan`,
/// borrowing its text, each item read as it is parsed), or, when that pass fails,
/// item by item to say which one.
fn read_items(
    key: &Key,
    kind: &KindConfig,
    items: &serde_json::value::RawValue,
    date: Option<i64>,
) -> Result<Vec<ReadItem>, String> {
    let pointers = item_pointers(kind, chrono::Utc::now().timestamp_micros());
    let read = |index: usize, item: Result<Json<'_>, String>| match item {
        Ok(item) => read_item(key, kind, &pointers, date, index, &item),
        Err(e) => ReadItem::Unreadable {
            index,
            id: None,
            reason: format!("not JSON: {e}"),
        },
    };
    // Each item read as soon as it is parsed and its tree dropped: one item's tree at a
    // time, not the page's.
    let mut read_all = Vec::new();
    if scan::each_element(items.get(), |item| {
        read_all.push(read(read_all.len(), Ok(item)));
    })
    .is_ok()
    {
        return Ok(read_all);
    }
    Ok(crate::sender::item_texts(items)?
        .into_iter()
        .enumerate()
        .map(|(index, raw)| read(index, scan::parse(raw.get())))
        .collect())
}

fn read_item(
    key: &Key,
    kind: &KindConfig,
    pointers: &crate::change::Pointers<'_>,
    date: Option<i64>,
    index: usize,
    item: &Json<'_>,
) -> ReadItem {
    if let Some(exclude) = &kind.exclude {
        if item
            .pointer(exclude)
            .is_some_and(|v| !matches!(v, Json::Null))
        {
            return ReadItem::Excluded;
        }
    }
    let read = pointers
        .read(item, &key.source, &kind.name)
        .map(|mut c| {
            c.account.clear();
            c.account.push_str(key.account.stored());
            if let Some(date) = date {
                c.version = date;
            }
            c
        })
        .and_then(|c| match &kind.incremental {
            Some(inc) => {
                crate::change::read_version(item, &inc.field, inc.format).map(|t| (c, Some(t)))
            }
            None => Ok((c, None)),
        });
    match read {
        Ok((change, modified)) => ReadItem::Read {
            index,
            change,
            modified,
        },
        Err(e) => ReadItem::Unreadable {
            index,
            id: crate::change::read_id(item, &kind.id).ok(),
            reason: e.to_string(),
        },
    }
}
