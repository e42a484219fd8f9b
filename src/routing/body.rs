//! Message bodies as body filters (`json`, `xpath`) see them: parsed lazily,
//! at most once per format each time a message is routed, and only when a
//! body filter asks. A body that is larger than [`MAX_BODY_BYTES`], nested
//! deeper than [`MAX_BODY_DEPTH`], XML with more than [`MAX_XML_NODES`]
//! nodes, not UTF-8, empty or not well-formed parses to nothing, and no body filter matches nothing: no error, no
//! panic, time and memory bounded by the size cap.
//!
//! JSON is parsed with serde_json, whose recursion limit is the depth cap. XML is parsed with roxmltree, which refuses any DTD (so no entity
//! is declared or expanded) and stays linear on deep input; the tree is then
//! copied into the document that XPath evaluates, refusing depth past the
//! cap on the way.

use roxmltree::{NodeType, ParsingOptions};
use std::cell::OnceCell;
use std::fmt;
use sxd_document::dom::{Document, Element, Root};
use sxd_document::{Package, QName};

/// The largest body a body filter parses; a larger one does not match.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The most nodes (elements, text, comments, processing instructions) an
/// XML body may have for an `xpath` filter. XPath evaluation costs about a
/// microsecond per node, so a dense 1 MiB body (250,000 empty elements)
/// would hold routing for a quarter of a second; a document of 1 MiB with
/// ordinary markup has fewer nodes than this.
pub const MAX_XML_NODES: u32 = 65_536;

/// The deepest nesting a body filter accepts: JSON arrays and objects
/// inside each other (serde_json's recursion limit of 128 admits 127), XML
/// elements inside each other.
pub const MAX_BODY_DEPTH: usize = 127;

/// The formats body filters asked for a body in, none of which it parsed
/// as. Its `Display` names them: `JSON`, `XML`, `JSON or XML`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unparsable {
    /// A `json` filter asked.
    Json,
    /// An `xpath` filter asked.
    Xml,
    /// Filters of both kinds asked.
    JsonAndXml,
}

impl fmt::Display for Unparsable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Json => "JSON",
            Self::Xml => "XML",
            Self::JsonAndXml => "JSON or XML",
        })
    }
}

/// One message body, parsed on first use.
pub struct Body<'a> {
    bytes: &'a [u8],
    json: OnceCell<Option<serde_json::Value>>,
    xml: OnceCell<Option<Package>>,
}

impl<'a> Body<'a> {
    /// A body not parsed yet; creating it costs nothing.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            json: OnceCell::new(),
            xml: OnceCell::new(),
        }
    }

    /// The body as a JSON document, if it is one within the bounds.
    pub fn json(&self) -> Option<&serde_json::Value> {
        self.json.get_or_init(|| parse_json(self.bytes)).as_ref()
    }

    /// The body as an XML document, if it is one within the bounds.
    pub fn xml(&self) -> Option<Document<'_>> {
        self.xml
            .get_or_init(|| parse_xml(self.bytes))
            .as_ref()
            .map(Package::as_document)
    }

    /// The formats filters asked for the body in, when it parsed as none
    /// of them (or was past the bounds); `None` when nothing asked, or
    /// when it parsed as one: a JSON body that an `xpath` filter could
    /// not read is still a readable body.
    pub fn unparsable(&self) -> Option<Unparsable> {
        let json = self.json.get().map(Option::is_some);
        let xml = self.xml.get().map(Option::is_some);
        match (json, xml) {
            (Some(false), Some(false)) => Some(Unparsable::JsonAndXml),
            (Some(false), None) => Some(Unparsable::Json),
            (None, Some(false)) => Some(Unparsable::Xml),
            _ => None,
        }
    }

    /// Whether nothing asked for the body yet.
    #[cfg(test)]
    pub fn is_unparsed(&self) -> bool {
        self.json.get().is_none() && self.xml.get().is_none()
    }
}

fn parse_json(bytes: &[u8]) -> Option<serde_json::Value> {
    if bytes.len() > MAX_BODY_BYTES {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

fn parse_xml(bytes: &[u8]) -> Option<Package> {
    if bytes.len() > MAX_BODY_BYTES {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let options = ParsingOptions {
        allow_dtd: false,
        nodes_limit: MAX_XML_NODES,
        ..ParsingOptions::default()
    };
    let parsed = roxmltree::Document::parse_with_options(text, options).ok()?;
    copy_tree(&parsed)
}

/// Where a copied node goes.
#[derive(Clone, Copy)]
enum Parent<'d> {
    Root(Root<'d>),
    Element(Element<'d>),
}

/// Copies `parsed` into a document XPath can evaluate, iteratively; `None`
/// when elements nest deeper than [`MAX_BODY_DEPTH`].
fn copy_tree(parsed: &roxmltree::Document<'_>) -> Option<Package> {
    let package = Package::new();
    {
        let doc = package.as_document();
        // The copies of the elements enclosing the current node, with
        // the ids of their originals; the document root first.
        let mut parents = vec![(parsed.root().id(), Parent::Root(doc.root()))];
        for node in parsed.root().descendants().skip(1) {
            let enclosing = node.parent().map(|p| p.id());
            while parents.last().is_some_and(|(id, _)| Some(*id) != enclosing) {
                parents.pop();
            }
            let (_, parent) = *parents.last()?;
            match node.node_type() {
                NodeType::Root => {}
                NodeType::Element => {
                    if parents.len() > MAX_BODY_DEPTH {
                        return None;
                    }
                    let element = copy_element(doc, node);
                    match parent {
                        Parent::Root(root) => root.append_child(element),
                        Parent::Element(p) => p.append_child(element),
                    }
                    parents.push((node.id(), Parent::Element(element)));
                }
                NodeType::Text => {
                    if let (Parent::Element(p), Some(text)) = (parent, node.text()) {
                        p.append_child(doc.create_text(text));
                    }
                }
                NodeType::Comment => {
                    let comment = doc.create_comment(node.text().unwrap_or_default());
                    match parent {
                        Parent::Root(root) => root.append_child(comment),
                        Parent::Element(p) => p.append_child(comment),
                    }
                }
                NodeType::PI => {
                    if let Some(pi) = node.pi() {
                        let pi = doc.create_processing_instruction(pi.target, pi.value);
                        match parent {
                            Parent::Root(root) => root.append_child(pi),
                            Parent::Element(p) => p.append_child(pi),
                        }
                    }
                }
            }
        }
    }
    Some(package)
}

/// One element with its expanded name, attributes and the namespace
/// prefixes it declares (for `name()` and the namespace axis).
fn copy_element<'d>(doc: Document<'d>, node: roxmltree::Node<'_, '_>) -> Element<'d> {
    let tag = node.tag_name();
    let element = doc.create_element(QName::with_namespace_uri(tag.namespace(), tag.name()));
    let parent = node.parent_element();
    for ns in node.namespaces() {
        let inherited = parent.and_then(|p| p.lookup_namespace_uri(ns.name()));
        if inherited != Some(ns.uri()) {
            element.register_prefix(ns.name().unwrap_or_default(), ns.uri());
        }
    }
    if let Some(uri) = tag.namespace() {
        element.set_preferred_prefix(node.lookup_prefix(uri));
    }
    for attribute in node.attributes() {
        let name = QName::with_namespace_uri(attribute.namespace(), attribute.name());
        let copied = element.set_attribute_value(name, attribute.value());
        if let Some(uri) = attribute.namespace() {
            copied.set_preferred_prefix(node.lookup_prefix(uri));
        }
    }
    element
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_json(depth: usize) -> Vec<u8> {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
    }

    fn nested_xml(depth: usize) -> Vec<u8> {
        format!("{}{}", "<a>".repeat(depth), "</a>".repeat(depth)).into_bytes()
    }

    #[test]
    fn unparsable_names_the_formats_asked_for_when_none_parsed() {
        let neither = Body::new(b"plain text");
        assert_eq!(neither.unparsable(), None, "nothing asked yet");
        assert!(neither.json().is_none());
        assert_eq!(neither.unparsable(), Some(Unparsable::Json));
        assert!(neither.xml().is_none());
        assert_eq!(neither.unparsable(), Some(Unparsable::JsonAndXml));

        let json = Body::new(b"{}");
        assert!(json.xml().is_none());
        assert_eq!(json.unparsable(), Some(Unparsable::Xml));
        assert!(json.json().is_some());
        assert_eq!(json.unparsable(), None, "it parsed as one format asked");

        let xml = Body::new(b"<order/>");
        assert!(xml.json().is_none());
        assert!(xml.xml().is_some());
        assert_eq!(xml.unparsable(), None);

        let shown: Vec<String> = [Unparsable::Json, Unparsable::Xml, Unparsable::JsonAndXml]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown, ["JSON", "XML", "JSON or XML"]);
    }

    #[test]
    fn json_within_the_bounds_parses() {
        let body = br#"{"order": {"id": 7, "tags": ["a"]}}"#;
        let parsed = Body::new(body);
        assert_eq!(
            parsed.json().and_then(|v| v["order"]["id"].as_i64()),
            Some(7)
        );
        assert!(Body::new(&nested_json(MAX_BODY_DEPTH)).json().is_some());
    }

    #[test]
    fn json_too_deep_too_large_invalid_or_empty_does_not_parse() {
        assert!(Body::new(&nested_json(MAX_BODY_DEPTH + 1)).json().is_none());
        assert!(Body::new(&nested_json(100_000)).json().is_none());
        let mut huge = br#"{"pad": ""#.to_vec();
        huge.resize(MAX_BODY_BYTES + 1, b'x');
        huge.extend_from_slice(br#""}"#);
        assert!(Body::new(&huge).json().is_none());
        assert!(Body::new(b"").json().is_none());
        assert!(Body::new(b"{\"a\": ").json().is_none());
        assert!(Body::new(b"{\"a\": \"\xff\xfe\"}").json().is_none());
        assert!(Body::new(b"<a/>").json().is_none());
    }

    #[test]
    fn xml_within_the_bounds_parses() {
        let body = br#"<?xml version="1.0"?><!-- c --><o:order xmlns:o="urn:o" o:id="7"><?pi x?>text</o:order>"#;
        let doc = Body::new(body);
        let root = doc.xml().map(|d| d.root().children().len());
        assert_eq!(root, Some(2));
        assert!(Body::new(&nested_xml(MAX_BODY_DEPTH)).xml().is_some());
        // The root, the element `r` and its children.
        let children = MAX_XML_NODES as usize - 2;
        let dense = format!("<r>{}</r>", "<a/>".repeat(children));
        assert!(Body::new(dense.as_bytes()).xml().is_some());
    }

    #[test]
    fn xml_too_deep_too_large_hostile_invalid_or_empty_does_not_parse() {
        assert!(Body::new(&nested_xml(MAX_BODY_DEPTH + 1)).xml().is_none());
        // Far too deep for any recursive walk; refused in linear time.
        assert!(Body::new(&nested_xml(200_000)).xml().is_none());
        let laughs = br#"<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<lolz>&lol9;</lolz>"#;
        assert!(Body::new(laughs).xml().is_none());
        let external = br#"<!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/passwd">]><a>&x;</a>"#;
        assert!(Body::new(external).xml().is_none());
        assert!(Body::new(b"<a>&undeclared;</a>").xml().is_none());
        let dense = format!("<r>{}</r>", "<a/>".repeat(MAX_XML_NODES as usize));
        assert!(dense.len() < MAX_BODY_BYTES);
        assert!(Body::new(dense.as_bytes()).xml().is_none());
        let mut huge = b"<a>".to_vec();
        huge.resize(MAX_BODY_BYTES, b'x');
        huge.extend_from_slice(b"</a>");
        assert!(Body::new(&huge).xml().is_none());
        assert!(Body::new(b"").xml().is_none());
        assert!(Body::new(b"<a>\xff</a>").xml().is_none());
        assert!(Body::new(b"<a><b></a>").xml().is_none());
        assert!(Body::new(b"{\"a\": 1}").xml().is_none());
    }

    #[test]
    fn a_body_is_parsed_once() {
        let body = Body::new(br#"{"a": 1}"#);
        let first = body.json().map(std::ptr::from_ref);
        let second = body.json().map(std::ptr::from_ref);
        assert!(first.is_some() && first == second);
    }
}
