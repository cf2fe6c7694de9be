//! The daemon's configuration file (`portcullis.toml`), documented in
//! `docs/OPERATIONS.md`. Relative paths are taken from the file's directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use thiserror::Error;

#[derive(Debug, Clone)]
pub struct Config {
    pub provider_id: String,
    pub listen: Vec<SocketAddr>,
    pub key_file: PathBuf,
    pub policy: PathBuf,
    pub state_dir: PathBuf,
    pub admin_socket: PathBuf,
    /// A Unix socket serving ya-environment-protocol.v1 (JSON-RPC, LSP
    /// framing) to local runtimes, each the principal whose `unix_uid` is
    /// its user.
    pub environment_socket: Option<PathBuf>,
    pub limits: Limits,
    /// Serve HTTPS/WSS with this certificate chain and key (PEM).
    pub tls: Option<TlsFiles>,
    pub audit: AuditConfig,
    /// Where tools' secrets are read from (one file per secret, named as
    /// the secret): `secrets_dir`, else systemd's `$CREDENTIALS_DIRECTORY`.
    pub secrets_dir: Option<PathBuf>,
    /// How long a tool call waits for an operator's approval.
    pub approval_timeout: Duration,
    /// Where to serve `GET /metrics` over plain HTTP too (the admin socket
    /// always serves `/v1/metrics`).
    pub metrics_listen: Option<SocketAddr>,
    pub egress: EgressConfig,
    pub artifacts: ArtifactsConfig,
    /// Runtimes' relay endpoints the gateway dials out to (`[[relay]]`).
    pub relays: Vec<RelayEndpoint>,
}

/// `[[relay]]`: a runtime's relay endpoint the gateway connects to and
/// serves sessions on (docs/OPERATIONS.md, "Dial out to a runtime").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayEndpoint {
    /// `wss://host[:port]/path` (`ws://` only to a loopback host).
    pub url: String,
    /// Where the bearer token the endpoint expects is read (at each
    /// connection, so a rotated token is picked up).
    pub token: TokenSource,
    /// CA certificates (PEM) the endpoint's TLS certificate must chain to;
    /// Debian's bundle where unset.
    pub ca_file: Option<PathBuf>,
    /// Instead of a CA: the SHA-256 of the endpoint's certificate (DER),
    /// the only one accepted.
    pub cert_sha256: Option<[u8; 32]>,
    /// The plain profile's principal (JSON text frames, no Noise): the
    /// runtime is whoever holds the endpoint's TLS certificate, and its
    /// requests run with this principal's grants. `None`: the Noise
    /// profile, where the runtime proves a principal's key itself.
    pub plain_principal: Option<String>,
    /// The session speaks ya-environment-protocol.v1 (JSON-RPC: in the
    /// Noise channel's records, or as the plain profile's text messages)
    /// instead of relay.v1 frames.
    pub environment: bool,
}

/// Where a relay endpoint's bearer token is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    /// A systemd credential's name (`LoadCredential=`): the file of that
    /// name in `$CREDENTIALS_DIRECTORY`, which only the service has.
    Credential(String),
}

impl TokenSource {
    /// The file to read now.
    pub fn path(&self) -> Result<PathBuf, String> {
        match self {
            Self::File(path) => Ok(path.clone()),
            Self::Credential(name) => std::env::var_os("CREDENTIALS_DIRECTORY")
                .map(|dir| PathBuf::from(dir).join(name))
                .ok_or_else(|| {
                    format!(
                        "token_credential `{name}`: $CREDENTIALS_DIRECTORY is not set (is the \
                         credential loaded with LoadCredential= in the service?)"
                    )
                }),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelay {
    url: String,
    #[serde(default)]
    token_file: Option<PathBuf>,
    /// A systemd credential's name (`LoadCredential=`), read from
    /// `$CREDENTIALS_DIRECTORY`.
    #[serde(default)]
    token_credential: Option<String>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    cert_sha256: Option<String>,
    /// `noise` (the default) or `plain`.
    #[serde(default)]
    profile: Option<String>,
    /// The principal of a `plain` endpoint.
    #[serde(default)]
    principal: Option<String>,
    /// `ya-environment-relay.v1` (the default) or
    /// `ya-environment-protocol.v1`.
    #[serde(default)]
    protocol: Option<String>,
}

/// `[artifacts]`: uploads of results to the runtime's storage.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactsConfig {
    /// The CA certificates (PEM) an `https` upload URL's server is checked
    /// against; Debian's bundle where unset.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `[egress]`: the proxy commands with an egress allow-list go through.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// Names the proxy resolves to these addresses instead of asking DNS
    /// (off by default; for tests and split-horizon setups). The
    /// allow-list still decides, and a private address still needs an
    /// address entry.
    #[serde(default)]
    pub resolve: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
}

/// `[audit]`: retention.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Entries older than this are pruned, e.g. `"90d"`.
    #[serde(default, deserialize_with = "optional_duration")]
    pub max_age: Option<Duration>,
    /// At most this many entries are kept (the oldest go first). This is
    /// the size bound: sled frees disk space lazily, so a byte limit could
    /// not be kept exactly; docs/OPERATIONS.md gives bytes per entry.
    #[serde(default)]
    pub max_entries: Option<u64>,
}

impl AuditConfig {
    pub fn retains_everything(&self) -> bool {
        self.max_age.is_none() && self.max_entries.is_none()
    }
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Open TCP connections at once (handshaking or not).
    pub max_connections: usize,
    /// Authenticated sessions of one principal at once.
    pub max_sessions_per_principal: usize,
    /// Requests of one session in flight at once.
    pub max_in_flight: usize,
    /// Time to send the HTTP request head.
    #[serde(deserialize_with = "duration")]
    pub header_timeout: Duration,
    /// Time from the WebSocket upgrade to `relay.accepted`.
    #[serde(deserialize_with = "duration")]
    pub handshake_timeout: Duration,
    /// Silence after which the gateway pings; twice this closes the session.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// How long SIGTERM waits for requests in flight.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// The largest frame (JSON) taken or sent in parts: a request or a
    /// result larger than one record. `"16 MiB"` or bytes.
    #[serde(deserialize_with = "size")]
    pub max_frame: usize,
    /// Bytes that frames arriving in parts may hold, every session
    /// together: memory a crowd of peers sending large frames can take.
    #[serde(deserialize_with = "size")]
    pub max_frames_in_parts: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_sessions_per_principal: 64,
            max_in_flight: 64,
            header_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            max_frame: portcullis_wire::record::DEFAULT_MAX_FRAME,
            max_frames_in_parts: 256 << 20,
        }
    }
}

/// A size as `"16 MiB"` or a number of bytes.
fn size<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    let bytes = match Size::deserialize(d)? {
        Size::Bytes(n) => n,
        Size::Text(text) => {
            portcullis_policy::units::parse_size(&text).map_err(serde::de::Error::custom)?
        }
    };
    usize::try_from(bytes).map_err(|_| serde::de::Error::custom("the size is too large"))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    portcullis_policy::units::parse_duration(&text).map_err(serde::de::Error::custom)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_provider_id")]
    provider_id: String,
    #[serde(default)]
    listen: Vec<SocketAddr>,
    key_file: PathBuf,
    policy: PathBuf,
    state_dir: PathBuf,
    admin_socket: PathBuf,
    #[serde(default)]
    environment_socket: Option<PathBuf>,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    tls: Option<TlsFiles>,
    #[serde(default)]
    audit: AuditConfig,
    #[serde(default)]
    secrets_dir: Option<PathBuf>,
    #[serde(default, deserialize_with = "optional_duration")]
    approval_timeout: Option<Duration>,
    #[serde(default)]
    metrics_listen: Option<SocketAddr>,
    #[serde(default)]
    egress: EgressConfig,
    #[serde(default)]
    artifacts: ArtifactsConfig,
    #[serde(default)]
    relay: Vec<RawRelay>,
}

/// Why a relay endpoint's URL is refused: only `wss://`, or `ws://` to a
/// loopback host (tests, a runtime on the same machine).
pub fn relay_url_allowed(url: &str) -> Result<(), &'static str> {
    let (tls, rest) = match url.split_once("://") {
        Some(("wss", rest)) => (true, rest),
        Some(("ws", rest)) => (false, rest),
        _ => return Err("the URL must start with wss:// (or ws:// to a loopback host)"),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err("the URL needs a host, and no user name or password in it");
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !tls && !loopback {
        return Err("ws:// (no TLS) is refused except to a loopback host; use wss://");
    }
    Ok(())
}

fn default_provider_id() -> String {
    "portcullis".to_string()
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("config {path}: {message}")]
    Value { path: PathBuf, message: String },
}

impl Config {
    /// Why `serve` would have nothing to serve on (no `listen`, no
    /// `[[relay]]`); `portcullis stdio` needs neither.
    pub fn nothing_to_serve(&self) -> Option<String> {
        (self.listen.is_empty() && self.relays.is_empty() && self.environment_socket.is_none())
            .then(|| {
                "`listen` needs at least one address, e.g. [\"127.0.0.1:7443\"], \
             unless the gateway dials out (`[[relay]]`) or serves `environment_socket`"
                    .to_string()
            })
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            let before = &text[..offset.min(text.len())];
            ConfigError::Invalid {
                path: path.into(),
                line: before.matches('\n').count() + 1,
                column: before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1,
                message: e.message().to_string(),
            }
        })?;
        let value_error = |message: &str| ConfigError::Value {
            path: path.into(),
            message: message.to_string(),
        };
        let l = raw.limits;
        if l.max_connections == 0 || l.max_sessions_per_principal == 0 || l.max_in_flight == 0 {
            return Err(value_error("limits must be at least 1"));
        }
        if l.max_frame < portcullis_wire::record::MAX_RECORD_LEN {
            return Err(value_error(
                "`[limits] max_frame` must be at least 64 KiB (one record), e.g. \"16 MiB\"",
            ));
        }
        if l.max_frames_in_parts < l.max_frame {
            return Err(value_error(
                "`[limits] max_frames_in_parts` must be at least `max_frame` (one whole frame), \
                 e.g. \"256 MiB\"",
            ));
        }
        // Either would prune the whole audit log every minute: surely a
        // slip, and one that destroys evidence.
        if raw.audit.max_entries == Some(0) {
            return Err(value_error(
                "`[audit] max_entries = 0` would delete every audit entry; \
                 remove the line to keep everything, or give a bound such as 1_000_000",
            ));
        }
        if raw.audit.max_age == Some(Duration::ZERO) {
            return Err(value_error(
                "`[audit] max_age` of zero would delete every audit entry; \
                 remove the line to keep everything, or give an age such as \"90d\"",
            ));
        }
        if let Some(bad) = raw
            .egress
            .resolve
            .keys()
            .find(|name| portcullis_policy::egress::normalize_name(name).is_none())
        {
            return Err(value_error(&format!(
                "`[egress] resolve`: `{bad}` is not a host name"
            )));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let mut relays = Vec::new();
        for (n, relay) in raw.relay.into_iter().enumerate() {
            let at =
                |m: String| value_error(&format!("`[[relay]]` #{} ({}): {m}", n + 1, relay.url));
            relay_url_allowed(&relay.url).map_err(|m| at(m.to_string()))?;
            let token = match (relay.token_file, &relay.token_credential) {
                (Some(file), None) => TokenSource::File(resolve(file)),
                (None, Some(name)) if !name.is_empty() && !name.contains('/') => {
                    TokenSource::Credential(name.clone())
                }
                _ => {
                    return Err(at(
                        "give the bearer token's source: `token_file` or `token_credential` \
                         (one of them; never the token itself)"
                            .into(),
                    ));
                }
            };
            let plain_principal = match (relay.profile.as_deref(), relay.principal) {
                (None | Some("noise"), None) => None,
                (None | Some("noise"), Some(_)) => {
                    return Err(at(
                        "`principal` is for `profile = \"plain\"`; with Noise the runtime proves \
                         its principal's key itself"
                            .into(),
                    ));
                }
                // Over TLS, or ws:// to loopback (for tests), as every URL.
                (Some("plain"), Some(principal)) => Some(principal),
                (Some("plain"), None) => {
                    return Err(at(
                        "`profile = \"plain\"` needs `principal`: whose grants the runtime's \
                         requests run with"
                            .into(),
                    ));
                }
                (Some(other), _) => {
                    return Err(at(format!(
                        "`profile` is `noise` (the default) or `plain`, not `{other}`"
                    )));
                }
            };
            let cert_sha256 =
                match (&relay.cert_sha256, &relay.ca_file) {
                    (None, _) => None,
                    (Some(_), Some(_)) => {
                        return Err(at("give `ca_file` or `cert_sha256`, not both".into()));
                    }
                    (Some(pin), None) => {
                        let hex = pin.replace(':', "").to_ascii_lowercase();
                        let bytes = hex::decode(&hex)
                            .ok()
                            .and_then(|b| <[u8; 32]>::try_from(b).ok());
                        Some(bytes.ok_or_else(|| {
                            at("`cert_sha256` is the certificate's SHA-256 in hex (64 digits, e.g. \
                            from `openssl x509 -outform der | sha256sum`)"
                            .into())
                        })?)
                    }
                };
            let environment = match relay.protocol.as_deref() {
                None | Some("ya-environment-relay.v1") => false,
                Some(portcullis_wire::envproto::PROTOCOL) => true,
                Some(other) => {
                    return Err(at(format!(
                        "`protocol` is `ya-environment-relay.v1` (the default) or `{}`, not \
                         `{other}`",
                        portcullis_wire::envproto::PROTOCOL
                    )));
                }
            };
            relays.push(RelayEndpoint {
                url: relay.url,
                token,
                cert_sha256,
                ca_file: relay.ca_file.map(resolve),
                plain_principal,
                environment,
            });
        }
        Ok(Self {
            relays,
            provider_id: raw.provider_id,
            listen: raw.listen,
            key_file: resolve(raw.key_file),
            policy: resolve(raw.policy),
            state_dir: resolve(raw.state_dir),
            admin_socket: resolve(raw.admin_socket),
            environment_socket: raw.environment_socket.map(resolve),
            limits: raw.limits,
            audit: raw.audit,
            secrets_dir: raw
                .secrets_dir
                .map(resolve)
                .or_else(|| std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from)),
            approval_timeout: raw.approval_timeout.unwrap_or(Duration::from_secs(300)),
            metrics_listen: raw.metrics_listen,
            egress: raw.egress,
            artifacts: raw.artifacts,
            tls: raw.tls.map(|t| TlsFiles {
                cert: resolve(t.cert),
                key: resolve(t.key),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_that_keeps_nothing_is_refused() {
        let base = "listen = [\"127.0.0.1:7443\"]\nkey_file = \"k\"\npolicy = \"p\"\n\
                    state_dir = \"s\"\nadmin_socket = \"a\"\n[audit]\n";
        for (line, says) in [
            ("max_entries = 0", "max_entries = 0"),
            ("max_age = \"0s\"", "max_age"),
        ] {
            let error = Config::parse(&format!("{base}{line}\n"), Path::new("c.toml")).unwrap_err();
            let message = error.to_string();
            assert!(
                message.contains(says) && message.contains("every audit entry"),
                "{message}"
            );
        }
        let kept = Config::parse(
            &format!("{base}max_entries = 1\nmax_age = \"1s\"\n"),
            Path::new("c.toml"),
        );
        assert!(kept.is_ok(), "{kept:?}");
    }

    #[test]
    fn parses_with_defaults_and_relative_paths() {
        let text = r#"
listen = ["127.0.0.1:7443"]
key_file = "gateway.key"
policy = "/etc/portcullis/policy.toml"
state_dir = "state"
admin_socket = "admin.sock"
[limits]
idle_timeout = "30s"
[audit]
max_age = "90d"
max_entries = 1_000_000
"#;
        let c = Config::parse(text, Path::new("/etc/portcullis/portcullis.toml")).unwrap();
        assert_eq!(c.key_file, Path::new("/etc/portcullis/gateway.key"));
        assert_eq!(c.policy, Path::new("/etc/portcullis/policy.toml"));
        assert_eq!(c.limits.idle_timeout, Duration::from_secs(30));
        assert_eq!(c.limits.max_in_flight, 64);
        assert_eq!(c.provider_id, "portcullis");
        assert_eq!(c.audit.max_age, Some(Duration::from_secs(90 * 86_400)));
        assert_eq!(c.audit.max_entries, Some(1_000_000));
    }

    #[test]
    fn errors_have_positions() {
        let err = Config::parse("listen = []\nbogus = 1\n", Path::new("c.toml")).unwrap_err();
        assert!(err.to_string().contains("c.toml:2:1"), "{err}");
    }

    #[test]
    fn egress_resolve_names_must_be_host_names() {
        let base = "listen = [\"127.0.0.1:0\"]\nkey_file = \"k\"\npolicy = \"p\"\nstate_dir = \"s\"\nadmin_socket = \"a\"\n";
        let path = Path::new("/etc/portcullis/portcullis.toml");
        let good = Config::parse(
            &format!("{base}[egress.resolve]\n\"pypi.test\" = [\"127.0.0.2\"]\n"),
            path,
        )
        .unwrap();
        assert_eq!(
            good.egress.resolve["pypi.test"],
            ["127.0.0.2".parse::<std::net::IpAddr>().unwrap()]
        );
        let bad = Config::parse(
            &format!("{base}[egress.resolve]\n\"a b\" = [\"127.0.0.2\"]\n"),
            path,
        );
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("`a b` is not a host name")
        );
        let not_an_address = Config::parse(
            &format!("{base}[egress.resolve]\n\"x.test\" = [\"nowhere\"]\n"),
            path,
        );
        assert!(not_an_address.is_err());
    }

    #[test]
    fn relay_endpoints_are_checked_when_the_config_loads() {
        let base = "key_file = \"k\"\npolicy = \"p\"\nstate_dir = \"s\"\nadmin_socket = \"a\"\n";
        let path = Path::new("/etc/portcullis/portcullis.toml");
        let relay = |body: &str| Config::parse(&format!("{base}[[relay]]\n{body}\n"), path);
        // Dialing out alone is a gateway: `listen` is not needed then.
        let good = relay(
            "url = \"wss://runtime.example/api/v1/relay/connect\"\ntoken_file = \"relay.token\"",
        )
        .unwrap();
        assert!(good.listen.is_empty());
        assert_eq!(
            good.relays[0].token,
            TokenSource::File("/etc/portcullis/relay.token".into())
        );
        assert_eq!(good.relays[0].plain_principal, None);
        // Loading is fine (`portcullis stdio` needs no listener); `serve`
        // says what is missing.
        let nowhere = Config::parse(base, path).unwrap();
        assert!(
            nowhere
                .nothing_to_serve()
                .is_some_and(|why| why.contains("unless the gateway dials out"))
        );
        assert!(good.nothing_to_serve().is_none());
        for (body, says) in [
            (
                "url = \"ws://runtime.example/x\"\ntoken_file = \"t\"",
                "loopback",
            ),
            (
                "url = \"https://runtime.example/x\"\ntoken_file = \"t\"",
                "must start with wss://",
            ),
            (
                "url = \"wss://user:pw@runtime.example/x\"\ntoken_file = \"t\"",
                "no user name",
            ),
            ("url = \"wss://runtime.example/x\"", "token_file"),
            (
                "url = \"wss://runtime.example/x\"\ntoken_file = \"t\"\nprofile = \"plain\"",
                "needs `principal`",
            ),
            (
                "url = \"wss://runtime.example/x\"\ntoken_file = \"t\"\nprincipal = \"p\"",
                "is for `profile = \"plain\"`",
            ),
            (
                "url = \"wss://runtime.example/x\"\ntoken_file = \"t\"\nprofile = \"fancy\"",
                "not `fancy`",
            ),
            (
                "url = \"wss://r.example/x\"\ntoken_file = \"t\"\ncert_sha256 = \"abc\"",
                "64 digits",
            ),
            (
                "url = \"wss://r.example/x\"\ntoken_file = \"t\"\nca_file = \"c\"\ncert_sha256 = \"00\"",
                "not both",
            ),
        ] {
            let error = relay(body).unwrap_err().to_string();
            assert!(error.contains(says), "{body}: {error}");
        }
        for loopback in ["ws://127.0.0.1:9/x", "ws://localhost/x", "ws://[::1]:9/x"] {
            relay(&format!("url = \"{loopback}\"\ntoken_file = \"t\"")).unwrap();
        }
        let plain = relay("url = \"wss://r.example/x\"\ntoken_file = \"t\"\nprofile = \"plain\"\nprincipal = \"rt\"").unwrap();
        assert_eq!(plain.relays[0].plain_principal.as_deref(), Some("rt"));
    }
}
