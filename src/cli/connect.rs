//! `portcullis connect` and `portcullis ping`: the client side, as an
//! operator debugging a gateway uses it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use portcullis::client::{Client, ClientOptions};
use portcullis::keyfile;
use portcullis_crypto::PublicKey;
use zeroize::Zeroizing;

use crate::cli::fail;

/// How to reach and authenticate to a gateway.
#[derive(clap::Args)]
pub struct Target {
    /// Gateway URL, e.g. ws://127.0.0.1:7443
    pub url: String,
    /// The gateway's public key (base64, from `portcullis keys show` on the
    /// gateway). The connection stops before sending credentials if the
    /// gateway proves another key.
    #[arg(long)]
    pub gateway_key: String,
    /// This client's key file; without it a throwaway key is used (then a
    /// token must identify you).
    #[arg(long)]
    pub identity: Option<PathBuf>,
    /// Read a bearer token from this environment variable instead of using
    /// the identity key to authenticate.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
}

impl Target {
    fn options(&self) -> Result<ClientOptions, String> {
        let key =
            PublicKey::from_base64(&self.gateway_key).map_err(|e| format!("--gateway-key: {e}"))?;
        let identity = match &self.identity {
            Some(path) => keyfile::load(path).map_err(|e| e.to_string())?,
            None => portcullis_crypto::StaticKeypair::generate().map_err(|e| e.to_string())?,
        };
        let mut options = ClientOptions::new(&self.url, key, identity);
        if let Some(var) = &self.token_env {
            let token =
                std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?;
            options.token = Some(Zeroizing::new(token));
        }
        Ok(options)
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// Connects and prints the gateway's hello as JSON.
pub fn connect(target: Target) -> ExitCode {
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            let client = Client::connect(target.options()?)
                .await
                .map_err(|e| e.to_string())?;
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
            let client = Client::connect(target.options()?)
                .await
                .map_err(|e| e.to_string())?;
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
