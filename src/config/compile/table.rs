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

/// Every named filter, then `[[filter_table]]`: at least one entry, and
/// each branch's name used once.
pub(super) fn compile_table(
    raw: &RawConfig,
    endpoints: &BTreeMap<String, Arc<Endpoint>>,
) -> Result<Vec<Branch>> {
    let mut filters = FilterCompiler::new(&raw.filters);
    for name in raw.filters.keys() {
        filters.compile(name)?;
    }

    if raw.filter_table.is_empty() {
        return Err(InvalidKey::new(
            "filter_table",
            "has no entries; add at least one [[filter_table]]",
        ));
    }
    let mut branches = Vec::new();
    let mut seen_names = HashSet::new();
    for (i, entry) in raw.filter_table.iter().enumerate() {
        let branch = compile_entry(i, entry, raw, endpoints, &mut filters)?;
        if !seen_names.insert(branch.name().to_owned()) {
            return Err(InvalidKey::new(
                format!("filter_table[{i}].name"),
                format!(
                    "branch name \"{}\" is used twice; names must be unique",
                    branch.name()
                ),
            ));
        }
        branches.push(branch);
    }
    Ok(branches)
}

fn compile_entry(
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
    let list = branch_list(entry, raw, endpoints, &key)?;
    let strategy = branch_strategy(entry, &key)?;
    let outage = branch_outage(entry, &key)?;
    let name = match &entry.name {
        Some(n) if n.trim().is_empty() => {
            return Err(InvalidKey::new(
                key("name"),
                "must not be empty; omit it for the default",
            ));
        }
        Some(n) => n.clone(),
        None => format!(
            "{}->{}",
            entry.filter,
            entry.endpoint.as_deref().unwrap_or("registered")
        ),
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
    .with_outage(outage)
    .with_registrable(entry.registrable))
}

/// A branch's endpoint list: its endpoint, then the members of its backup
/// list, each once.
fn branch_list(
    entry: &RawFilterEntry,
    raw: &RawConfig,
    endpoints: &BTreeMap<String, Arc<Endpoint>>,
    key: &dyn Fn(&str) -> String,
) -> Result<Vec<Arc<Endpoint>>> {
    let mut list = Vec::new();
    match &entry.endpoint {
        Some(first) => list.push(
            endpoints
                .get(first)
                .ok_or_else(|| {
                    InvalidKey::new(
                        key("endpoint"),
                        format!(
                            "unknown endpoint \"{first}\" (defined: {})",
                            names(endpoints)
                        ),
                    )
                })?
                .clone(),
        ),
        None if entry.registrable => {}
        None => {
            return Err(InvalidKey::new(
                key("endpoint"),
                "is missing: name the branch's first endpoint (only a registrable = true \
                 entry may leave it out, to take the endpoints services register)",
            ));
        }
    }
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
        // Members were checked against `endpoints` by `check_backup_lists`.
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
    Ok(list)
}

/// How a branch walks its list: `failover` or `round_robin`.
fn branch_strategy(entry: &RawFilterEntry, key: &dyn Fn(&str) -> String) -> Result<Strategy> {
    Ok(match entry.strategy.as_str() {
        "failover" => Strategy::Failover,
        "round_robin" => Strategy::RoundRobin,
        other => {
            return Err(InvalidKey::new(
                key("strategy"),
                format!("unknown strategy \"{other}\" (expected \"failover\" or \"round_robin\")"),
            ));
        }
    })
}

/// What a branch does when an outage exhausts its list: `wait`, or
/// `dead_letter` at once or after `outage_timeout_ms`.
fn branch_outage(entry: &RawFilterEntry, key: &dyn Fn(&str) -> String) -> Result<Outage> {
    Ok(match (entry.outage.as_str(), entry.outage_timeout_ms) {
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
    })
}
