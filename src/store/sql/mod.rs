//! The statements on `store`'s tables, both backends side by side: `events`
//! (`processed_events`, the claim; `dead_letters`) and `resources` (the guarded upsert,
//! the tie rule in SQL, local reads, tombstones) and `fetches` (`pending_fetches`) and `views` (the typed views over
//! `resources`, `typed_views`). Only
//! `store` calls them.

mod claim_write;
mod events;
pub(crate) mod fetches;
mod resources;
pub(crate) mod views;

pub(crate) use claim_write::{ClaimWrite, claim_and_write};

pub(crate) use events::{
    Claim, claim_many, claim_sql, claims_of, dead_letter_counts, dead_letters, delete_dead_letter,
    forget_dead_letters_of_account, prune_dead_letters, prune_events, record_dead_letter,
    release_claim, set_event_outcomes,
};
pub use events::{ClaimRow, DeadLetter, DeadLetterSummary, Kept, SourceCount};
pub(crate) use events::{Which, dead_letter_summaries};
pub(crate) use resources::{
    MAX_BATCH_ROWS, accounts_with, count_live, erase_rows, in_key_order, live_ids_before,
    purge_account, resource_row, stored_rows, stored_rows_in_range, stored_rows_with_states,
    tombstone, tombstone_account, upsert_many, upsert_sql,
};
pub use resources::{ResourceRow, StoredRow};
