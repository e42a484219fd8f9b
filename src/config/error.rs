//! Configuration errors: each names the file, the key and what is wrong.

use std::path::PathBuf;

/// Why a configuration could not be loaded. Its `Display` is the one line
/// printed to the user.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed into the expected shape.
    #[error("{path}: {message}")]
    Load {
        /// The configuration file.
        path: PathBuf,
        /// What went wrong, from the parser.
        message: String,
    },
    /// The file parsed but a value is invalid or a reference unresolved.
    #[error("{path}: {source}")]
    Invalid {
        /// The configuration file.
        path: PathBuf,
        /// The key and what is wrong with it.
        source: InvalidKey,
    },
    /// An environment override (`SWITCHYARD__SECTION__KEY`) does not fit
    /// its key, or gave it an invalid value. Its value is not repeated: it
    /// may be a secret.
    #[error("environment variable {var}: {message}")]
    Env {
        /// The variable's name.
        var: String,
        /// The key it overrides and what is wrong.
        message: String,
    },
}

/// One invalid key: `key: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct InvalidKey {
    /// Dotted path of the offending key, e.g. `filter_table[1].endpoint`.
    pub key: String,
    /// What is wrong and, where it helps, what to do.
    pub message: String,
}

impl InvalidKey {
    /// An error at `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}
