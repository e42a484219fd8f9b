//! Reading the TOML file with the `config` crate, environment overrides
//! (`SWITCHYARD__SECTION__KEY`) layered on top.

use super::error::ConfigError;
use super::raw::RawConfig;
use super::{Settings, compile};
use config::{File, FileFormat, Value};
use std::path::{Path, PathBuf};

/// Environment variable naming the configuration file.
pub const CONFIG_ENV: &str = "SWITCHYARD_CONFIG";
/// The configuration file used when neither `--config` nor the environment names one.
pub const DEFAULT_CONFIG_PATH: &str = "config/switchyard.toml";
/// Prefix of environment variables that override configuration keys.
const ENV_PREFIX: &str = "SWITCHYARD__";

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
    let mut raw = build(source, path, true)?;
    raw.relative_to(path.parent().unwrap_or(Path::new("")));
    compile(&raw).map_err(|source| ConfigError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// Compiles TOML text; `origin` stands for the file name in errors, and
/// relative file paths are taken from its directory. No environment
/// overrides: used by tests and tools that build configs in memory.
pub fn load_str(toml: &str, origin: &str) -> Result<Settings, ConfigError> {
    let path = PathBuf::from(origin);
    let mut raw = build(File::from_str(toml, FileFormat::Toml), &path, false)?;
    raw.relative_to(path.parent().unwrap_or(Path::new("")));
    compile(&raw).map_err(|source| ConfigError::Invalid { path, source })
}

fn build<S>(source: S, path: &Path, with_env: bool) -> Result<RawConfig, ConfigError>
where
    S: config::Source + Send + Sync + 'static,
{
    let load_error = |e: config::ConfigError| ConfigError::Load {
        path: path.to_owned(),
        message: one_line(&e.to_string()),
    };
    let file = config::Config::builder()
        .add_source(source)
        .build()
        .map_err(load_error)?;
    let mut builder = config::Config::builder().add_source(file.clone());
    if with_env {
        let tree = config::Source::collect(&file).map_err(load_error)?;
        for (key, value) in env_overrides(&tree, std::env::vars()) {
            builder = builder.set_override(key, value).map_err(load_error)?;
        }
    }
    builder
        .build()
        .map_err(load_error)?
        .try_deserialize::<RawConfig>()
        .map_err(load_error)
}

/// `SWITCHYARD__SECTION__KEY=value` pairs as configuration paths. Each
/// segment is matched case-insensitively against the keys the file already
/// has (environment names are upper case, endpoint names often are not);
/// a segment the file lacks is taken in lower case; a number under an
/// array is an index (`SWITCHYARD__FILTER_TABLE__0__PRIORITY`).
fn env_overrides(
    tree: &config::Map<String, Value>,
    vars: impl Iterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    let mut overrides = Vec::new();
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let mut key = String::new();
        let mut node = Some(Value::from(tree.clone()));
        for segment in rest.split("__") {
            let table = node.clone().and_then(|v| v.into_table().ok());
            let array = node.clone().and_then(|v| v.into_array().ok());
            if let (Some(items), Ok(index)) = (&array, segment.parse::<usize>()) {
                key.push_str(&format!("[{index}]"));
                node = items.get(index).cloned();
                continue;
            }
            let existing = table
                .as_ref()
                .and_then(|t| t.keys().find(|k| k.eq_ignore_ascii_case(segment)).cloned());
            let resolved = existing.unwrap_or_else(|| segment.to_ascii_lowercase());
            node = table.and_then(|t| t.get(&resolved).cloned());
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&resolved);
        }
        overrides.push((key, value));
    }
    overrides
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::env_overrides;
    use config::{File, FileFormat, Source};

    #[test]
    fn environment_names_resolve_to_the_files_keys() {
        let toml = r#"
            [endpoints.primaryServiceQueue]
            broker = "main"
            [[filter_table]]
            filter = "all"
        "#;
        let tree = File::from_str(toml, FileFormat::Toml)
            .collect()
            .unwrap_or_default();
        let vars = [
            (
                "SWITCHYARD__ENDPOINTS__PRIMARYSERVICEQUEUE__CONFIRM_TIMEOUT_MS",
                "7",
            ),
            ("SWITCHYARD__BROKERS__MAIN__URI", "amqp://h"),
            ("SWITCHYARD__FILTER_TABLE__0__PRIORITY", "3"),
            ("SWITCHYARD_CONFIG", "ignored.toml"),
            ("PATH", "/bin"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let found = env_overrides(&tree, vars.into_iter());
        assert_eq!(
            found,
            [
                (
                    "endpoints.primaryServiceQueue.confirm_timeout_ms".to_owned(),
                    "7".to_owned()
                ),
                ("brokers.main.uri".to_owned(), "amqp://h".to_owned()),
                ("filter_table[0].priority".to_owned(), "3".to_owned()),
            ]
        );
    }
}
