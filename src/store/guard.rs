//! The webhook path's labels for a change the guarded upsert did not apply. Pure; the
//! rule itself is `change::tie` (and its SQL twin `store::sql::guard_condition`).

pub use crate::change::tie::Guard;
use crate::change::tie::{Relation, Stored, relation};
use crate::change::{Change, Outcome};

/// Outcome of a webhook change the guarded upsert ([`Guard::NewerOnly`]) did not apply:
///
/// - stored version newer: `stale`;
/// - equal version, same state and deletion flag: `stale` (a replay with a new event id);
/// - equal version, anything different: `conflict` — senders with whole-second
///   timestamps emit several states within one second, and neither can be trusted to be
///   the latest, so the row is kept and the sender's current state decides later.
pub fn classify_unapplied(stored: Option<Stored<'_>>, incoming: &Change) -> Outcome {
    match relation(stored, incoming) {
        Relation::NewerStored | Relation::Equal => Outcome::Stale,
        // Differing is the rule's conflict; Missing and NewerIncoming cannot reach here
        // (the upsert would have applied them) unless the row changed under us, and then
        // the sender's current state decides too.
        Relation::Differing | Relation::Missing | Relation::NewerIncoming => Outcome::Conflict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::tie::truth_table;

    #[test]
    fn unapplied_webhook_changes_are_stale_or_conflicts_by_the_tie_rule() {
        for case in truth_table() {
            let Some((version, deleted, state)) = case.stored else {
                continue;
            };
            let stored = Stored {
                digest: None,
                version,
                deleted,
                state,
            };
            let incoming = case.incoming("s", "k", "1");
            if Guard::NewerOnly.admits(case.relation) {
                continue;
            }
            let want = match case.relation {
                Relation::Differing => Outcome::Conflict,
                _ => Outcome::Stale,
            };
            assert_eq!(
                classify_unapplied(Some(stored), &incoming),
                want,
                "{}",
                case.name
            );
        }
    }
}
