//! The XPath 1.0 expressions of `xpath` filters: checked when compiled
//! (the prefixes, functions and variables they name), evaluated on each
//! XML body.

use super::error::BodyFilterError;
use sxd_xpath::{Context, Factory, Value};

/// A compiled `xpath` filter: an XPath 1.0 expression and the namespace
/// prefixes it may use.
#[derive(Debug)]
pub struct XPathTest {
    expression: String,
    namespaces: Vec<(String, String)>,
}

impl XPathTest {
    /// Checks `expression` by parsing it and evaluating it once on a small
    /// document, so that a syntax error, an unknown function or an
    /// undeclared prefix is refused with the configuration, not met on
    /// every message.
    pub fn new(
        expression: &str,
        namespaces: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, BodyFilterError> {
        let test = Self {
            expression: expression.to_owned(),
            namespaces: namespaces.into_iter().collect(),
        };
        let names = scan_names(expression);
        if names.variable {
            return Err(BodyFilterError::XPath(
                "uses a variable ($name); none is defined".to_owned(),
            ));
        }
        if let Some(p) = names
            .prefixes
            .iter()
            .find(|p| !test.namespaces.iter().any(|(declared, _)| declared == *p))
        {
            return Err(BodyFilterError::XPath(format!(
                "uses the prefix \"{p}\", which namespaces does not declare"
            )));
        }
        if let Some(f) = names.calls.iter().find(|f| !XPATH_FUNCTIONS.contains(f)) {
            return Err(BodyFilterError::XPath(format!(
                "calls \"{f}()\", which is not an XPath 1.0 function available here"
            )));
        }
        let probe = sxd_document::Package::new();
        let doc = probe.as_document();
        doc.root().append_child(doc.create_element("probe"));
        test.evaluate(doc)?;
        Ok(test)
    }

    /// Whether the expression holds on `doc`: a boolean is its value, a
    /// node-set must be non-empty, a number non-zero and not NaN, a string
    /// non-empty. An expression that fails to evaluate does not match.
    pub fn matches(&self, doc: sxd_document::dom::Document<'_>) -> bool {
        // The evaluator panics on a name test whose prefix has no namespace.
        // `new` refuses such an expression; should one slip through, the
        // message does not match rather than take the forwarder down.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.evaluate(doc)))
            .is_ok_and(|result| result.unwrap_or(false))
    }

    fn evaluate(&self, doc: sxd_document::dom::Document<'_>) -> Result<bool, BodyFilterError> {
        let xpath = Factory::new()
            .build(&self.expression)
            .map_err(|e| BodyFilterError::XPath(format!("does not parse ({e})")))?
            .ok_or_else(|| BodyFilterError::XPath("is empty".to_owned()))?;
        let mut context = Context::new();
        for (prefix, uri) in &self.namespaces {
            context.set_namespace(prefix, uri);
        }
        let value = xpath
            .evaluate(&context, doc.root())
            .map_err(|e| BodyFilterError::XPath(format!("cannot be evaluated ({e})")))?;
        Ok(match value {
            Value::Boolean(b) => b,
            Value::Number(n) => n != 0.0 && !n.is_nan(),
            Value::String(s) => !s.is_empty(),
            Value::Nodeset(nodes) => nodes.size() > 0,
        })
    }
}

/// The functions `xpath` filters can call: XPath 1.0's core library but
/// `id()` and `lang()`.
const XPATH_FUNCTIONS: &[&str] = &[
    "last",
    "position",
    "count",
    "local-name",
    "namespace-uri",
    "name",
    "string",
    "concat",
    "starts-with",
    "contains",
    "substring-before",
    "substring-after",
    "substring",
    "string-length",
    "normalize-space",
    "translate",
    "boolean",
    "not",
    "true",
    "false",
    "number",
    "sum",
    "floor",
    "ceiling",
    "round",
];

/// What an XPath expression names, found outside its string literals.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Names<'e> {
    /// The prefixes of qualified names (`o` in `o:order` or `o:*`; not
    /// axes like `child::`).
    pub(super) prefixes: Vec<&'e str>,
    /// The names called as functions, node type tests excluded.
    pub(super) calls: Vec<&'e str>,
    /// Whether it refers to a variable (`$name`).
    pub(super) variable: bool,
}

pub(super) fn scan_names(expression: &str) -> Names<'_> {
    let name_start = |c: char| c == '_' || c.is_alphabetic();
    let name_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    let not_called = [
        "node",
        "text",
        "comment",
        "processing-instruction",
        "and",
        "or",
        "div",
        "mod",
    ];
    let mut names = Names::default();
    let mut rest = expression;
    while let Some(c) = rest.chars().next() {
        if c == '\'' || c == '"' {
            let after = &rest[1..];
            rest = after.find(c).map_or("", |end| &after[end + 1..]);
        } else if c == '$' {
            names.variable = true;
            rest = &rest[1..];
        } else if name_start(c) {
            let end = rest.find(|ch| !name_char(ch)).unwrap_or(rest.len());
            let (name, after) = rest.split_at(end);
            rest = after;
            if let Some(local) = after.strip_prefix(':') {
                if local.starts_with(|ch| name_start(ch) || ch == '*') {
                    names.prefixes.push(name);
                    rest = local;
                }
            } else if after.trim_start().starts_with('(') && !not_called.contains(&name) {
                names.calls.push(name);
            }
        } else {
            rest = &rest[c.len_utf8()..];
        }
    }
    names
}
