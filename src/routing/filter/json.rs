//! The JSON pointers of `json` filters (RFC 6901): parsed once, resolved
//! on each body.

use super::error::BodyFilterError;

/// An RFC 6901 JSON pointer, split into its unescaped reference tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer {
    tokens: Vec<String>,
}

impl JsonPointer {
    /// Parses a pointer: `""` (the whole document) or `/`-prefixed tokens
    /// in which `~1` stands for `/` and `~0` for `~`.
    pub fn parse(pointer: &str) -> Result<Self, BodyFilterError> {
        if pointer.is_empty() {
            return Ok(Self { tokens: Vec::new() });
        }
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(BodyFilterError::Pointer(
                "must be \"\" (the whole document) or start with \"/\" (RFC 6901)",
            ));
        };
        let tokens = rest
            .split('/')
            .map(|token| {
                let mut out = String::with_capacity(token.len());
                let mut chars = token.chars();
                while let Some(c) = chars.next() {
                    if c != '~' {
                        out.push(c);
                        continue;
                    }
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => {
                            return Err(BodyFilterError::Pointer(
                                "has a \"~\" not followed by 0 or 1; write \"~\" as ~0 and \"/\" as ~1 (RFC 6901)",
                            ));
                        }
                    }
                }
                Ok(out)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { tokens })
    }

    /// The value the pointer refers to in `document`, if there is one.
    pub fn resolve<'v>(&self, document: &'v serde_json::Value) -> Option<&'v serde_json::Value> {
        use serde_json::Value as J;
        self.tokens
            .iter()
            .try_fold(document, |value, token| match value {
                J::Object(map) => map.get(token),
                J::Array(items) => array_index(token).and_then(|i| items.get(i)),
                _ => None,
            })
    }
}

/// An array index as RFC 6901 writes it: `0` or digits without a leading
/// zero. (`-`, the element after the last, never exists.)
fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}
