//! `portcullis connect` and `portcullis ping`: the client side, as an
//! operator debugging a gateway uses it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use portcullis_client::config as client_config;
use portcullis_client::listen::ProviderListener;
use portcullis_client::{Client, ClientOptions};
use portcullis_crypto::PublicKey;
use portcullis_wire::keyfile;
use zeroize::Zeroizing;

use crate::cli::{fail, runtime};

/// How to reach and authenticate to a gateway.
#[derive(clap::Args)]
pub struct Target {
    /// Gateway URL, e.g. ws://127.0.0.1:7443; or listen://ADDR to wait for
    /// a gateway that dials out to this machine (its `[[relay]]` url is
    /// ws://ADDR/api/v1/relay/connect; see --relay-token-file).
    pub url: String,
    /// The gateway's public key (base64, from `portcullis keys show` on the
    /// gateway). The connection stops before sending credentials if the
    /// gateway proves another key. Remembered for this URL in
    /// ~/.config/portcullis/gateways.toml, so it is needed once.
    #[arg(long)]
    pub gateway_key: Option<String>,
    /// This client's key file [default: ~/.config/portcullis/identity.key,
    /// created on first use].
    #[arg(long)]
    pub identity: Option<PathBuf>,
    /// Read a bearer token from this environment variable instead of using
    /// the identity key to authenticate.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// For wss:// URLs: the CA certificate (PEM) that signed the gateway's
    /// TLS certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// For listen:// URLs: the file holding the bearer token a dialing
    /// gateway must present (its `[[relay]]` token).
    #[arg(long, value_name = "FILE")]
    pub relay_token_file: Option<PathBuf>,
}

impl Target {
    fn options(&self) -> Result<ClientOptions, String> {
        let config_dir = client_config::dir();
        let key = match (&self.gateway_key, &config_dir) {
            (Some(key), _) => PublicKey::from_base64(key).map_err(|e| format!("--gateway-key: {e}"))?,
            (None, Some(dir)) => client_config::remembered_key(dir, &self.url).map_err(|e| e.to_string())?.ok_or_else(|| {
                format!("no key is remembered for {}; pass --gateway-key once (it is then remembered)", self.url)
            })?,
            (None, None) => return Err("pass --gateway-key (HOME is not set, so nothing is remembered)".into()),
        };
        let identity = match (&self.identity, &config_dir) {
            (Some(path), _) => keyfile::load(path).map_err(|e| e.to_string())?,
            (None, Some(dir)) => client_config::identity(dir).map_err(|e| e.to_string())?,
            (None, None) => return Err("pass --identity (HOME is not set)".into()),
        };
        let mut options = ClientOptions::new(&self.url, key, identity);
        options.tls_ca = self.tls_ca.clone();
        if let Some(var) = &self.token_env {
            let token =
                std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?;
            options.token = Some(Zeroizing::new(token));
        }
        Ok(options)
    }

    /// Connects (or, for listen://, waits for a gateway to dial in); on
    /// success remembers an explicitly given gateway key.
    pub async fn connect(&self) -> Result<Client, String> {
        let options = self.options()?;
        let key = options.gateway_key;
        let client = match self.url.strip_prefix("listen://") {
            Some(addr) => self.accept_one(addr).await?,
            None => Client::connect(options).await.map_err(|e| e.to_string())?,
        };
        if let (Some(_), Some(dir)) = (&self.gateway_key, client_config::dir())
            && let Err(e) = client_config::remember(&dir, &self.url, &key)
        {
            eprintln!("portcullis: could not remember the gateway key: {e}");
        }
        Ok(client)
    }
}

impl Target {
    /// Listens on `addr` until a gateway dials in with the relay token and
    /// proves the key this target pins. Connections that fail are said
    /// and the wait goes on.
    async fn accept_one(&self, addr: &str) -> Result<Client, String> {
        let file = self.relay_token_file.as_ref().ok_or(
            "a listen:// URL needs --relay-token-file: the token the gateway's [[relay]] presents",
        )?;
        let token = std::fs::read_to_string(file)
            .map(|t| Zeroizing::new(t.trim().to_string()))
            .map_err(|e| format!("--relay-token-file {}: {e}", file.display()))?;
        let listener = ProviderListener::bind(addr, token)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("portcullis: waiting for a gateway to dial ws://{bound}/api/v1/relay/connect");
        loop {
            match listener.accept(self.options()?).await {
                Ok(client) => return Ok(client),
                Err(e) => eprintln!("portcullis: a connection failed: {e}"),
            }
        }
    }
}

/// Connects and prints the gateway's hello as JSON.
pub fn connect(target: Target) -> ExitCode {
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            let client = target.connect().await?;
            let hello = serde_json::to_value(client.hello()).map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::to_string_pretty(&hello).unwrap_or_default()
            );
            Ok(())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// Connects and measures relay-level ping round trips.
pub fn ping(target: Target, count: u32) -> ExitCode {
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            let started = std::time::Instant::now();
            let client = target.connect().await?;
            println!(
                "connected in {:.2} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            client.accept_all().await.map_err(|e| e.to_string())?;
            for i in 1..=count {
                let rtt = client.ping().await.map_err(|e| e.to_string())?;
                println!("pong {i}: {:.3} ms", rtt.as_secs_f64() * 1e3);
                if i < count {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Ok(())
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
