//! A schedule (`every` or `cron`), the same check for a kind and for a catch-up.

use super::Checker;
use crate::config::types::*;

/// `every` or `cron` of a schedule; keys are named by `key`.
pub(super) fn validate_schedule(
    c: &mut Checker,
    key: &dyn Fn(&str) -> String,
    every: Option<&String>,
    cron: Option<&String>,
) -> Option<Schedule> {
    match (every, cron) {
        (Some(_), Some(_)) => {
            c.fail(key("cron"), "set either `every` or `cron`, not both");
            None
        }
        (Some(every), None) => match c.duration(&key("every"), every) {
            Some(d) => match every_to_cron(d) {
                Ok(_) => Some(Schedule::Every(d)),
                Err(e) => {
                    c.fail(key("every"), e);
                    None
                }
            },
            None => None,
        },
        (None, Some(cron)) => {
            if cron.split_whitespace().count() != 6 {
                c.fail(
                    key("cron"),
                    format!(
                        "{cron:?} must have 6 fields (sec min hour day month weekday, in UTC), e.g. \"0 */5 * * * *\""
                    ),
                );
            }
            Some(Schedule::Cron(cron.clone()))
        }
        (None, None) => None,
    }
}
