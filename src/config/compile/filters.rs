//! Named filters compiled into [`Filter`]s: one arm per filter kind,
//! references resolved and cycles refused, and the value and XPath tests
//! they carry checked once, with the configuration.

use super::shared::{Result, names};
use crate::config::InvalidKey;
use crate::config::raw::{RawFilter, RawXPathFilter, ScalarValue};
use crate::routing::{Filter, JsonPointer, Property, TopicPattern, ValueTest, XPathTest};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Compiles named filters, resolving references and rejecting cycles.
pub(super) struct FilterCompiler<'a> {
    raw: &'a BTreeMap<String, RawFilter>,
    done: HashMap<String, Arc<Filter>>,
    in_progress: Vec<String>,
}

impl<'a> FilterCompiler<'a> {
    pub(super) fn new(raw: &'a BTreeMap<String, RawFilter>) -> Self {
        Self {
            raw,
            done: HashMap::new(),
            in_progress: Vec::new(),
        }
    }

    pub(super) fn compile(&mut self, name: &str) -> Result<Arc<Filter>> {
        if let Some(f) = self.done.get(name) {
            return Ok(f.clone());
        }
        if self.in_progress.iter().any(|n| n == name) {
            let mut cycle = self.in_progress.clone();
            cycle.push(name.to_owned());
            return Err(InvalidKey::new(
                format!("filters.{name}"),
                format!(
                    "filters refer to each other in a cycle: {}",
                    cycle.join(" -> ")
                ),
            ));
        }
        let raw = self.raw.get(name).ok_or_else(|| {
            InvalidKey::new(
                format!("filters.{name}"),
                format!("unknown filter (defined: {})", names(self.raw)),
            )
        })?;
        self.in_progress.push(name.to_owned());
        let compiled = self.compile_one(name, raw);
        self.in_progress.pop();
        let compiled = Arc::new(compiled?);
        self.done.insert(name.to_owned(), compiled.clone());
        Ok(compiled)
    }

    // One arm per filter kind: kept whole so the kinds read side by side.
    fn compile_one(&mut self, name: &str, f: &RawFilter) -> Result<Filter> {
        let key = |k: &str| format!("filters.{name}.{k}");
        Ok(match f {
            RawFilter::Invalid { key: at, message } if at.is_empty() => {
                return Err(InvalidKey::new(format!("filters.{name}"), message.clone()));
            }
            RawFilter::Invalid { key: at, message } => {
                return Err(InvalidKey::new(key(at), message.clone()));
            }
            RawFilter::MatchAll => Filter::MatchAll,
            RawFilter::Header(h) => Filter::Header {
                name: h.header.clone(),
                test: value_test(
                    ValueKeys {
                        equals: h.equals.as_ref(),
                        exists: h.exists,
                        regex: h.regex.as_ref(),
                        one_of: h.one_of.as_ref(),
                    },
                    name,
                    true,
                )?,
            },
            RawFilter::Property(p) => {
                let property = Property::from_name(&p.property).ok_or_else(|| {
                    InvalidKey::new(
                        key("property"),
                        format!(
                            "unknown property \"{}\" (expected one of {})",
                            p.property,
                            Property::NAMES.join(", ")
                        ),
                    )
                })?;
                let keys = ValueKeys {
                    equals: p.equals.as_ref(),
                    exists: None,
                    regex: p.regex.as_ref(),
                    one_of: p.one_of.as_ref(),
                };
                Filter::Property {
                    property,
                    test: value_test(keys, name, false)?,
                }
            }
            RawFilter::RoutingKey(r) => Filter::RoutingKey(TopicPattern::parse(&r.pattern)),
            RawFilter::Json(j) => Filter::Json {
                pointer: JsonPointer::parse(&j.pointer)
                    .map_err(|e| InvalidKey::new(key("pointer"), e.to_string()))?,
                test: value_test(
                    ValueKeys {
                        equals: j.equals.as_ref(),
                        exists: j.exists,
                        regex: j.regex.as_ref(),
                        one_of: j.one_of.as_ref(),
                    },
                    name,
                    true,
                )?,
            },
            RawFilter::XPath(x) => Filter::XPath(xpath_test(x, name)?),
            RawFilter::Not(n) => Filter::Not(self.compile_ref(name, "filter", &n.filter)?),
            RawFilter::And(list) | RawFilter::Or(list) => {
                if list.filters.is_empty() {
                    return Err(InvalidKey::new(
                        key("filters"),
                        "must name at least one filter",
                    ));
                }
                let compiled = list
                    .filters
                    .iter()
                    .map(|m| self.compile_ref(name, "filters", m))
                    .collect::<Result<Vec<_>>>()?;
                if matches!(f, RawFilter::And(_)) {
                    Filter::And(compiled)
                } else {
                    Filter::Or(compiled)
                }
            }
        })
    }

    fn compile_ref(&mut self, from: &str, field: &str, to: &str) -> Result<Arc<Filter>> {
        if !self.raw.contains_key(to) {
            return Err(InvalidKey::new(
                format!("filters.{from}.{field}"),
                format!("unknown filter \"{to}\" (defined: {})", names(self.raw)),
            ));
        }
        self.compile(to)
    }
}

/// The keys that test a header, property or JSON value: exactly one is set.
struct ValueKeys<'a> {
    equals: Option<&'a ScalarValue>,
    exists: Option<bool>,
    regex: Option<&'a String>,
    one_of: Option<&'a Vec<ScalarValue>>,
}

fn value_test(f: ValueKeys<'_>, name: &str, exists_allowed: bool) -> Result<ValueTest> {
    let key = |k: &str| format!("filters.{name}.{k}");
    let mut tests = Vec::new();
    if let Some(v) = f.equals {
        tests.push(ValueTest::Equals(v.as_text()));
    }
    if let Some(exists) = f.exists {
        if !exists {
            return Err(InvalidKey::new(
                key("exists"),
                "only `exists = true` is supported; wrap the filter in a \"not\" filter",
            ));
        }
        if exists_allowed {
            tests.push(ValueTest::Exists);
        }
    }
    if let Some(pattern) = f.regex {
        let re = regex::Regex::new(pattern).map_err(|e| {
            InvalidKey::new(
                key("regex"),
                format!("invalid regular expression: {}", first_line(&e.to_string())),
            )
        })?;
        tests.push(ValueTest::Regex(re));
    }
    if let Some(options) = f.one_of {
        if options.is_empty() {
            return Err(InvalidKey::new(key("in"), "must list at least one value"));
        }
        tests.push(ValueTest::In(options.iter().map(|v| v.as_text()).collect()));
    }
    let expected = if exists_allowed {
        "one of equals, exists, regex, in"
    } else {
        "one of equals, regex, in"
    };
    match tests.len() {
        1 => Ok(tests.remove(0)),
        0 => Err(InvalidKey::new(
            format!("filters.{name}"),
            format!("needs {expected}"),
        )),
        _ => Err(InvalidKey::new(
            format!("filters.{name}"),
            format!("takes only {expected}, not several"),
        )),
    }
}

fn xpath_test(f: &RawXPathFilter, name: &str) -> Result<XPathTest> {
    let key = |k: &str| format!("filters.{name}.{k}");
    let expression = &f.expression;
    let namespaces = f.namespaces.clone().unwrap_or_default();
    for (prefix, uri) in &namespaces {
        if !is_ncname(prefix) {
            return Err(InvalidKey::new(
                key(&format!("namespaces.{prefix}")),
                "is not a namespace prefix (a name without \":\", starting with a letter or \"_\")",
            ));
        }
        if uri.is_empty() {
            return Err(InvalidKey::new(
                key(&format!("namespaces.{prefix}")),
                "must be a namespace URI, not empty",
            ));
        }
    }
    XPathTest::new(expression, namespaces).map_err(|e| {
        InvalidKey::new(
            key("expression"),
            format!(
                "invalid XPath 1.0 expression: {}",
                first_line(&e.to_string())
            ),
        )
    })
}

/// An XML name without a colon, as namespace prefixes are (ASCII letters,
/// digits, `_`, `-`, `.`, and any non-ASCII letter).
fn is_ncname(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn first_line(text: &str) -> String {
    text.lines().last().unwrap_or(text).trim().to_owned()
}
