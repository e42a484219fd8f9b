//! Bearer tokens, as both listeners check them: the HTTP ingress's
//! `tokens` and the admin endpoint's `/control` and `/registry`.

use hyper::HeaderMap;
use hyper::header::AUTHORIZATION;

/// What a request's `Authorization` says of `tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bearer {
    /// It carries one of them.
    Accepted,
    /// It carries no bearer token.
    Missing,
    /// It carries another.
    Wrong,
}

/// Reads `Authorization: Bearer <token>` (the scheme in any case, RFC
/// 9110) against `tokens`. Every token is compared in full, so the time
/// taken says nothing of which prefix matched.
pub fn bearer(headers: &HeaderMap, tokens: &[String]) -> Bearer {
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let Some(given) = given else {
        return Bearer::Missing;
    };
    let matched = tokens.iter().fold(false, |any, t| {
        any | same_bytes(t.as_bytes(), given.as_bytes())
    });
    if matched {
        Bearer::Accepted
    } else {
        Bearer::Wrong
    }
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, x) in a.iter().enumerate() {
        diff |= usize::from(x ^ b.get(i).copied().unwrap_or(!x));
    }
    diff == 0
}
