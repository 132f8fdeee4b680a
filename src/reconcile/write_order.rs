//! The order rules of a sweep's page writes, apart from the writes themselves: at most
//! one page's transaction is in flight while the next is compared, so a page's commit
//! may land before its predecessor's. These rules keep the resume point (the position
//! a full sweep restarts from) from ever naming a page whose predecessor is not
//! committed. Pure: `sweep` asks, then does.

/// The positions a sweep's committed pages reached. `P` is a position (an opaque
/// cursor and its time in the sweep).
#[derive(Debug)]
pub(super) struct WriteOrder<P> {
    /// Where a full sweep resumes: after the last page committed with all before it.
    committed_at: Option<P>,
    /// A page's write failed: later commits no longer move `committed_at`.
    failed: bool,
}

/// The page still being written, as the rules see it.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    /// Its transaction has ended (awaiting it costs nothing).
    pub finished: bool,
    /// It recorded a position of its own (it is not a full sweep's last page).
    pub has_position: bool,
}

/// What a page's commit records as the resume point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Record<P> {
    /// This position (`None`: clear it, the run starts over or is done).
    At(Option<P>),
    /// Leave the checkpoint as it is: the page in flight may have recorded its own.
    Keep,
}

impl<P: Clone> WriteOrder<P> {
    /// `start`: where the run started (a resumed full sweep), the resume point until
    /// a page commits.
    pub fn new(start: Option<P>) -> Self {
        Self {
            committed_at: start,
            failed: false,
        }
    }

    /// Whether the page in flight must be finished before this page's write starts:
    /// when it is done anyway (its position, not an older one, is then what this
    /// page's commit records), or when this is a full sweep's last page (`position`
    /// `None`), whose commit clears the resume point: a predecessor's commit must not
    /// land after it and leave one behind.
    pub fn finish_first(in_flight: Option<InFlight>, position: &Option<P>) -> bool {
        in_flight.is_some_and(|w| w.finished || (position.is_none() && w.has_position))
    }

    /// What this page's commit records. With no page in flight, its own position. Else
    /// it may land before the previous page's, so it records the position known
    /// committed now, or, when none is yet, leaves the checkpoint as it is. Clearing
    /// (the last page, a run not worth resuming) is always safe: the run starts over.
    pub fn record(&self, in_flight: bool, position: &Option<P>) -> Record<P> {
        match (in_flight, position, &self.committed_at) {
            (false, _, _) | (true, None, _) => Record::At(position.clone()),
            (true, Some(_), Some(committed)) => Record::At(Some(committed.clone())),
            (true, Some(_), None) => Record::Keep,
        }
    }

    /// A page's write committed: its position is the resume point, unless an earlier
    /// page failed (its drift is not written, so no later position may be recorded).
    pub fn committed(&mut self, position: Option<P>) {
        if !self.failed {
            self.committed_at = position;
        }
    }

    /// A page's write failed.
    pub fn failed(&mut self) {
        self.failed = true;
    }

    /// A page written item by item: the position its items are written at (the last
    /// committed one) and the one its last write records (its own, unless a page
    /// failed).
    pub fn one_by_one(&self, position: &Option<P>) -> (Option<P>, Option<P>) {
        let before = self.committed_at.clone();
        let after = if self.failed {
            before.clone()
        } else {
            position.clone()
        };
        (before, after)
    }

    /// The resume point the committed pages reached, if any.
    pub fn committed_at(&self) -> Option<P> {
        self.committed_at.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DONE: InFlight = InFlight {
        finished: true,
        has_position: true,
    };
    const BUSY: InFlight = InFlight {
        finished: false,
        has_position: true,
    };
    const BUSY_LAST: InFlight = InFlight {
        finished: false,
        has_position: false,
    };

    #[test]
    fn a_page_waits_only_for_a_finished_predecessor_or_before_clearing_the_resume_point() {
        assert!(!WriteOrder::<i32>::finish_first(None, &Some(1)));
        assert!(!WriteOrder::<i32>::finish_first(None, &None));
        assert!(WriteOrder::<i32>::finish_first(Some(DONE), &Some(1)));
        assert!(!WriteOrder::<i32>::finish_first(Some(BUSY), &Some(2)));
        // The last page clears the resume point: a predecessor that records one must
        // land first.
        assert!(WriteOrder::<i32>::finish_first(Some(BUSY), &None));
        assert!(!WriteOrder::<i32>::finish_first(Some(BUSY_LAST), &None));
    }

    #[test]
    fn a_page_records_its_own_position_only_when_nothing_is_in_flight() {
        let mut order = WriteOrder::new(None);
        assert_eq!(order.record(false, &Some(1)), Record::At(Some(1)));
        // Page 2 while page 1 is in flight, nothing committed yet: keep the checkpoint.
        assert_eq!(order.record(true, &Some(2)), Record::Keep);
        order.committed(Some(1));
        // Page 3 while page 2 is in flight: the position known committed, not its own.
        assert_eq!(order.record(true, &Some(3)), Record::At(Some(1)));
        // The last page clears, whatever is in flight.
        assert_eq!(order.record(true, &None), Record::At(None));
        assert_eq!(order.record(false, &None), Record::At(None));
    }

    #[test]
    fn after_a_failed_page_no_later_commit_moves_the_resume_point() {
        let mut order = WriteOrder::new(None);
        order.committed(Some(1));
        order.failed();
        order.committed(Some(3));
        assert_eq!(order.committed_at(), Some(1));
        assert_eq!(order.record(true, &Some(4)), Record::At(Some(1)));
        // A page written item by item after the failure records the old point too.
        assert_eq!(order.one_by_one(&Some(4)), (Some(1), Some(1)));
    }

    #[test]
    fn a_page_written_item_by_item_moves_the_resume_point_with_its_last_write() {
        let mut order = WriteOrder::new(None);
        assert_eq!(order.one_by_one(&Some(1)), (None, Some(1)));
        order.committed(Some(1));
        assert_eq!(order.one_by_one(&Some(2)), (Some(1), Some(2)));
        assert_eq!(order.one_by_one(&None), (Some(1), None));
    }
}
