//! Reading the TOML file with the `config` crate, environment overrides
//! (`SWITCHYARD__SECTION__KEY`) layered on top.

use super::error::{ConfigError, InvalidKey};
use super::raw::RawConfig;
use super::unknown::{describe, unknown_key};
use super::{Settings, compile};
use crate::errors::one_line_text;
use crate::uri::redact_uri;
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
    load_from(source, path, std::env::vars())
}

/// Compiles TOML text; `origin` stands for the file name in errors, and
/// relative file paths are taken from its directory. No environment
/// overrides: used by tests and tools that build configs in memory.
pub fn load_str(toml: &str, origin: &str) -> Result<Settings, ConfigError> {
    let source = File::from_str(toml, FileFormat::Toml);
    load_from(source, Path::new(origin), std::iter::empty())
}

/// [`load_str`] with `vars` as the environment.
#[cfg(test)]
pub(super) fn load_str_with_env(
    toml: &str,
    origin: &str,
    vars: &[(&str, &str)],
) -> Result<Settings, ConfigError> {
    let vars = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    load_from(
        File::from_str(toml, FileFormat::Toml),
        Path::new(origin),
        vars,
    )
}

fn load_from<S>(
    source: S,
    path: &Path,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<Settings, ConfigError>
where
    S: config::Source + Send + Sync + 'static,
{
    let (mut raw, overrides) = build(source, path, vars)?;
    raw.relative_to(path.parent().unwrap_or(Path::new("")));
    compile(&raw).map_err(|source| blame(path, &overrides, source))
}

/// An invalid key is the fault of the override that set it or one of its
/// parents, if any did, and otherwise of the file.
fn blame(path: &Path, overrides: &[Override], source: InvalidKey) -> ConfigError {
    let under = |o: &&Override| {
        source
            .key
            .strip_prefix(o.key.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    };
    match overrides.iter().find(under) {
        Some(o) => ConfigError::Env {
            var: o.var.clone(),
            message: source.to_string(),
        },
        None => ConfigError::Invalid {
            path: path.to_owned(),
            source,
        },
    }
}

/// One `SWITCHYARD__...` variable and the key it overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Override {
    var: String,
    key: String,
    value: String,
}

/// The raw configuration, and the overrides applied to it. When the
/// overridden configuration does not deserialize but the file alone does,
/// the first override that fails on its own is named.
fn build<S>(
    source: S,
    path: &Path,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<(RawConfig, Vec<Override>), ConfigError>
where
    S: config::Source + Send + Sync + 'static,
{
    let load_error = |e: config::ConfigError| ConfigError::Load {
        path: path.to_owned(),
        message: describe(&e),
    };
    let file = config::Config::builder()
        .add_source(source)
        .build()
        .map_err(load_error)?;
    let vars: Vec<_> = vars
        .filter(|(name, _)| name.starts_with(ENV_PREFIX))
        .collect();
    let overrides = if vars.is_empty() {
        Vec::new()
    } else {
        let tree = config::Source::collect(&file).map_err(load_error)?;
        env_overrides(&tree, vars.into_iter())
    };
    match deserialize(&file, &overrides) {
        Ok(raw) => Ok((raw, overrides)),
        Err(e) if overrides.is_empty() || deserialize(&file, &[]).is_err() => Err(load_error(e)),
        Err(e) => {
            let culprit = overrides
                .iter()
                .find_map(|o| Some((o, deserialize(&file, std::slice::from_ref(o)).err()?)));
            Err(match culprit {
                Some((o, e)) => ConfigError::Env {
                    var: o.var.clone(),
                    message: misfit(o, &e),
                },
                None => load_error(e),
            })
        }
    }
}

/// Why an override does not fit: the unknown key it names, or the key it
/// cannot set and why.
fn misfit(o: &Override, e: &config::ConfigError) -> String {
    let text = unknown_key(e)
        .unwrap_or_else(|| format!("cannot set {}: {}", o.key, one_line_text(&e.to_string())));
    // A URI's password must not come back through the parser's message.
    text.replace(&o.value, &redact_uri(&o.value))
}

fn deserialize(
    file: &config::Config,
    overrides: &[Override],
) -> Result<RawConfig, config::ConfigError> {
    let mut builder = config::Config::builder().add_source(file.clone());
    for o in overrides {
        builder = builder.set_override(o.key.as_str(), o.value.as_str())?;
    }
    builder.build()?.try_deserialize::<RawConfig>()
}

/// `SWITCHYARD__SECTION__KEY=value` pairs as configuration paths. Each
/// segment is matched case-insensitively against the keys the file already
/// has (environment names are upper case, endpoint names often are not);
/// a segment the file lacks is taken in lower case; a number under an
/// array is an index (`SWITCHYARD__FILTER_TABLE__0__PRIORITY`).
fn env_overrides(
    tree: &config::Map<String, Value>,
    vars: impl Iterator<Item = (String, String)>,
) -> Vec<Override> {
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
        overrides.push(Override {
            var: name,
            key,
            value,
        });
    }
    overrides
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
        let found: Vec<(String, String)> = env_overrides(&tree, vars.into_iter())
            .into_iter()
            .map(|o| (o.key, o.value))
            .collect();
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
