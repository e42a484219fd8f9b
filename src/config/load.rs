//! Reading the TOML file with the `config` crate, environment overrides
//! (`SWITCHYARD__SECTION__KEY`) layered on top.

use super::error::ConfigError;
use super::raw::RawConfig;
use super::{Settings, compile};
use config::{Environment, File, FileFormat};
use std::path::{Path, PathBuf};

/// Environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "SWITCHYARD_CONFIG";
/// The configuration file used when neither `--config` nor the environment names one.
pub const DEFAULT_CONFIG_PATH: &str = "config/switchyard.toml";

/// The configuration path: `--config`, then `$SWITCHYARD_CONFIG`, then the default.
pub fn config_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os(CONFIG_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
}

/// Loads, overrides from the environment, and compiles the file at `path`.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    if !path.is_file() {
        return Err(ConfigError::Load {
            path: path.to_owned(),
            message: "file not found (set --config or SWITCHYARD_CONFIG)".to_owned(),
        });
    }
    let source = File::from(path).format(FileFormat::Toml).required(true);
    let raw = build(source, path, true)?;
    compile(&raw).map_err(|source| ConfigError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// Compiles TOML text; `origin` stands for the file name in errors. No
/// environment overrides: used by tests and tools that build configs in memory.
pub fn load_str(toml: &str, origin: &str) -> Result<Settings, ConfigError> {
    let path = PathBuf::from(origin);
    let raw = build(File::from_str(toml, FileFormat::Toml), &path, false)?;
    compile(&raw).map_err(|source| ConfigError::Invalid { path, source })
}

fn build<S>(source: S, path: &Path, with_env: bool) -> Result<RawConfig, ConfigError>
where
    S: config::Source + Send + Sync + 'static,
{
    let mut builder = config::Config::builder().add_source(source);
    if with_env {
        builder = builder.add_source(
            Environment::with_prefix("SWITCHYARD")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true),
        );
    }
    let load_error = |e: config::ConfigError| ConfigError::Load {
        path: path.to_owned(),
        message: one_line(&e.to_string()),
    };
    builder
        .build()
        .map_err(load_error)?
        .try_deserialize::<RawConfig>()
        .map_err(load_error)
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
