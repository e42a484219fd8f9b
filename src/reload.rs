//! Live reconfiguration: where new configurations come from.
//!
//! A [`Reload`] is the configuration file loaded anew: valid [`Settings`]
//! or the [`ConfigError`] naming the key that is wrong. [`sources`] yields
//! one on SIGHUP and one whenever the file's content changes on disk
//! (polled, so an editor's save-by-rename, a symlink swap or a copy over it
//! all count; a change is taken once the content has held still for one
//! poll). The forwarder (`Forwarder::reloads`) validates and
//! prepares each and switches to it as one unit; a rejected one is logged
//! in one line and changes nothing. A reload never ends the process.

use crate::config::{self, ConfigError, Settings};
use crate::telemetry::Telemetry;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// A configuration loaded anew, or why it could not be.
pub type Reload = Result<Settings, ConfigError>;

/// How often the configuration file is read to see whether it changed.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Reload requests queued before the forwarder takes them.
const QUEUED: usize = 4;

/// Starts listening for SIGHUP and watching the file at `path`; each loads
/// it and is sent on the returned channel. Both stop as soon as the
/// receiver is dropped. Must be called on the runtime;
/// SIGHUP is caught from this call on, so it never ends the process, even
/// before the first configuration is live (the request then waits).
pub fn sources(path: PathBuf, telemetry: Telemetry) -> mpsc::Receiver<Reload> {
    let (tx, rx) = mpsc::channel(QUEUED);
    on_hangup(path.clone(), tx.clone(), telemetry.clone());
    tokio::spawn(watch_file(path, tx, telemetry));
    rx
}

fn on_hangup(path: PathBuf, tx: mpsc::Sender<Reload>, telemetry: Telemetry) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => hangup,
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGHUP; reload by changing the file");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            // Ends with the forwarder, which drops the receiver.
            tokio::select! {
                () = tx.closed() => return,
                signal = hangup.recv() => if signal.is_none() { return },
            }
            telemetry.reload_requested("SIGHUP");
            if tx.send(load(&path).await).await.is_err() {
                return;
            }
        }
    });
}

/// Reads the file every [`POLL_INTERVAL`]; content that differs from the
/// last loaded and has held still since the previous read is loaded. A file
/// that cannot be read for a moment (mid-rename) is skipped.
async fn watch_file(path: PathBuf, tx: mpsc::Sender<Reload>, telemetry: Telemetry) {
    let mut loaded = read(&path).await;
    let mut previous = loaded.clone();
    loop {
        // Ends with the forwarder, which drops the receiver.
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
        let Some(content) = read(&path).await else {
            previous = None;
            continue;
        };
        let settled = previous.as_ref() == Some(&content);
        if settled && loaded.as_ref() != Some(&content) {
            telemetry.reload_requested("file changed");
            loaded = Some(content.clone());
            if tx.send(load(&path).await).await.is_err() {
                return;
            }
        }
        previous = Some(content);
    }
}

/// The file's content, read off the runtime's workers; `None` if unreadable.
async fn read(path: &std::path::Path) -> Option<Vec<u8>> {
    let file = path.to_owned();
    tokio::task::spawn_blocking(move || std::fs::read(file).ok())
        .await
        .ok()
        .flatten()
}

/// Loads the file off the runtime's workers: loading reads TLS files too.
async fn load(path: &std::path::Path) -> Reload {
    let file = path.to_owned();
    match tokio::task::spawn_blocking(move || config::load(&file)).await {
        Ok(reload) => reload,
        Err(e) => Err(ConfigError::Load {
            path: path.to_owned(),
            message: format!("the load task failed: {e}"),
        }),
    }
}
