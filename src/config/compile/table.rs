//! `[[filter_table]]` entries compiled into [`Branch`]es: the filter, the
//! endpoint list with its backups, the strategy and the outage rule.

use super::filters::FilterCompiler;
use super::shared::{Result, names};
use crate::config::InvalidKey;
use crate::config::raw::{RawConfig, RawFilterEntry};
use crate::destination::Endpoint;
use crate::routing::{Branch, Outage, Strategy};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

pub(super) fn compile_entry(
    i: usize,
    entry: &RawFilterEntry,
    raw: &RawConfig,
    endpoints: &BTreeMap<String, Arc<Endpoint>>,
    filters: &mut FilterCompiler<'_>,
) -> Result<Branch> {
    let key = |k: &str| format!("filter_table[{i}].{k}");
    if !raw.filters.contains_key(&entry.filter) {
        return Err(InvalidKey::new(
            key("filter"),
            format!(
                "unknown filter \"{}\" (defined: {})",
                entry.filter,
                names(&raw.filters)
            ),
        ));
    }
    let filter = filters.compile(&entry.filter)?;
    let first = endpoints.get(&entry.endpoint).ok_or_else(|| {
        InvalidKey::new(
            key("endpoint"),
            format!(
                "unknown endpoint \"{}\" (defined: {})",
                entry.endpoint,
                names(endpoints)
            ),
        )
    })?;
    let mut list = vec![first.clone()];
    if let Some(backup) = &entry.backup_list {
        let members = raw.backup_lists.get(backup).ok_or_else(|| {
            InvalidKey::new(
                key("backup_list"),
                format!(
                    "unknown backup list \"{backup}\" (defined: {})",
                    names(&raw.backup_lists)
                ),
            )
        })?;
        // Members were checked against `endpoints` above.
        list.extend(members.iter().filter_map(|m| endpoints.get(m).cloned()));
    }
    let mut seen = HashSet::new();
    if let Some(dup) = list.iter().find(|e| !seen.insert(e.name.clone())) {
        return Err(InvalidKey::new(
            key("backup_list"),
            format!(
                "endpoint \"{}\" appears twice in this branch's list",
                dup.name
            ),
        ));
    }
    let strategy = match entry.strategy.as_str() {
        "failover" => Strategy::Failover,
        "round_robin" => Strategy::RoundRobin,
        other => {
            return Err(InvalidKey::new(
                key("strategy"),
                format!("unknown strategy \"{other}\" (expected \"failover\" or \"round_robin\")"),
            ));
        }
    };
    let outage = match (entry.outage.as_str(), entry.outage_timeout_ms) {
        (_, Some(0)) => {
            return Err(InvalidKey::new(
                key("outage_timeout_ms"),
                "must be at least 1; omit it to dead-letter at once",
            ));
        }
        ("dead_letter", after) => Outage::DeadLetter {
            after: after.map(Duration::from_millis),
        },
        ("wait", Some(_)) => {
            return Err(InvalidKey::new(
                key("outage_timeout_ms"),
                "applies only with outage = \"dead_letter\" (\"wait\" holds for as long as \
                 the outage lasts)",
            ));
        }
        ("wait", None) => Outage::Wait,
        (other, _) => {
            return Err(InvalidKey::new(
                key("outage"),
                format!("unknown outage \"{other}\" (expected \"dead_letter\" or \"wait\")"),
            ));
        }
    };
    let name = match &entry.name {
        Some(n) if n.trim().is_empty() => {
            return Err(InvalidKey::new(
                key("name"),
                "must not be empty; omit it for the default",
            ));
        }
        Some(n) => n.clone(),
        None => format!("{}->{}", entry.filter, entry.endpoint),
    };
    Ok(Branch::new(
        name,
        entry.filter.clone(),
        filter,
        entry.priority,
        list,
        strategy,
    )
    .with_required(entry.required)
    .with_outage(outage))
}
