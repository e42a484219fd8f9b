//! Why a body filter (a JSON pointer, an XPath expression) cannot be
//! compiled.

/// Why a body filter cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum BodyFilterError {
    /// The pointer is not an RFC 6901 JSON pointer.
    #[error("{0}")]
    Pointer(&'static str),
    /// The expression does not parse or cannot be evaluated.
    #[error("{0}")]
    XPath(String),
}
