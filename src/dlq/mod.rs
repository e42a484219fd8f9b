//! `switchyard dlq inspect` and `switchyard dlq redrive`: the dead-letter
//! queue (`dead_letter.queue`, on the inbound broker) read in place.
//!
//! Both walk the queue from its head with `basic.get`, holding every
//! message they take unacked, and stop at `--limit` selected dead letters,
//! when no message is ready, or after as many messages as the queue held
//! when they started (so a dead letter that comes back while redrive runs
//! is not taken twice). Then every message still held goes back to the
//! queue in its original position. `inspect` acks nothing: the queue keeps
//! its content and order. `redrive` publishes a copy of each selected dead
//! letter to the inbound queue and acks the dead letter only once that copy
//! is confirmed, one at a time, so a redrive killed at any point loses
//! nothing and duplicates at most the message in hand.
//!
//! - `scan`: which dead letters a command takes ([`Selection`]) and the
//!   walk that takes them.
//! - `record`: one dead letter read (annotations, `x-death`, body
//!   preview) and the copy redrive publishes. Pure.
//! - `error`: why a command failed, and what a scan and a redrive did.
//! - `inspect`: the listing, a table or JSON lines.
//! - `redrive`: the copies, the progress bar, the summary.

mod error;
mod inspect;
pub(crate) mod record;
mod redrive;
mod scan;

pub use error::DlqError;
pub(crate) use inspect::inspect;
pub use inspect::{DEFAULT_INSPECT_LIMIT, Format};
pub(crate) use redrive::redrive;
pub use scan::Selection;

use crate::config::Settings;
use std::io::Write;

/// A `dlq` command, its values checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `dlq inspect`.
    Inspect(Selection, Format),
    /// `dlq redrive`; `true` for `--dry-run`.
    Redrive(Selection, bool),
}

/// Runs `request` for the command line: the listing or the redrive's lines
/// and summary on stdout, the listing's closing line on stderr, a progress
/// bar on stderr when it is a terminal; SIGINT stops a redrive between two
/// messages.
pub async fn execute(settings: Settings, request: Request) -> Result<(), DlqError> {
    let mut out = std::io::stdout();
    match request {
        Request::Inspect(selection, format) => {
            let done = inspect(&settings, &selection, format, &mut out).await?;
            let _ = writeln!(std::io::stderr(), "{done}");
        }
        Request::Redrive(selection, dry_run) => {
            let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let interrupt = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            let done = redrive(
                &settings, &selection, dry_run, progress, &mut out, interrupt,
            )
            .await?;
            writeln!(out, "{done}")?;
        }
    }
    Ok(())
}
