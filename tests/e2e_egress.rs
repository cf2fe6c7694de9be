//! Egress allow-lists, tried as an agent would: a command whose grant has
//! `network = { allow = [...] }` reaches what the list names through the
//! gateway's proxy, and nothing else — not an unlisted name, a private
//! address, a raw IP, another port, a TLS server other than the one it
//! asked for, UDP, or anything at all without the proxy. This machine
//! reaches no internet: the "outside" servers listen on loopback addresses
//! of the host (outside the command's network namespace), and the gateway's
//! `[egress] resolve` maps the test's names to them.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Gateway;
use portcullis_client::Client;
use portcullis_crypto::StaticKeypair;
use portcullis_store::{Decision, Kind};
use serde_json::{Value, json};

/// A server outside the command's world: answers each connection's HTTP
/// request with `hello from NAME`, counting connections.
struct Outside {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

fn http_server(ip: &str, name: &'static str) -> Outside {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let mut head = [0u8; 4096];
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = stream.read(&mut head);
            let body = format!("hello from {name}");
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Outside { addr, connections }
}

/// An HTTPS server for `pypi.test`, on a runtime of its own, and its
/// self-signed certificate (PEM) for the command to trust.
fn https_server(ip: &str) -> (Outside, String) {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let certified = rcgen::generate_simple_self_signed(vec!["pypi.test".to_string()]).unwrap();
    let pem = certified.cert.pem();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![certified.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind((ip, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let mut head = [0u8; 4096];
                    let _ = tls.read(&mut head).await;
                    let body = "hello over tls";
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(reply.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
    });
    (Outside { addr, connections }, pem)
}

struct World {
    gw: Gateway,
    alice: Client,
    /// `pypi.test` (listed on its port) → 127.0.0.2.
    pypi: Outside,
    /// Also on 127.0.0.2, on a port the list does not name for pypi.test.
    other_port: Outside,
    /// `pypi.test`'s HTTPS server, on 127.0.0.2.
    tls: Outside,
    /// `internal.test` (listed) → 127.0.0.3, which no address entry covers.
    internal: Outside,
}

async fn world() -> World {
    let alice_key = StaticKeypair::generate().unwrap();
    let pypi = http_server("127.0.0.2", "pypi");
    let other_port = http_server("127.0.0.2", "other-port");
    let internal = http_server("127.0.0.3", "internal");
    let policy = |tls_port: u16| {
        format!(
            r#"{preamble}
[[grant]]
id = "alice"
principals = ["alice"]
fileops = {{ main = "ro" }}
shell = {{ commands = ["python3"], cwd_roots = ["main"], pty = true, env_set = {{ PATH = "/usr/bin:/bin" }}, network = {{ allow = ["pypi.test:{pypi}", "pypi.test:{tls_port}", "internal.test:{internal}", "127.0.0.2:*"] }} }}
"#,
            preamble = common::principal("alice", &alice_key) + common::MAIN_ROOT,
            pypi = pypi.addr.port(),
            internal = internal.addr.port(),
        )
    };
    let (tls, cert) = https_server("127.0.0.2");
    let config = r#"
[egress.resolve]
"pypi.test" = ["127.0.0.2"]
"unlisted.test" = ["127.0.0.2"]
"internal.test" = ["127.0.0.3"]
"#;
    let gw = Gateway::start(&policy(tls.addr.port()), config);
    std::fs::write(gw.dir.join("workspace/ca.pem"), cert).unwrap();
    let alice = gw.connect(&alice_key).await.unwrap();
    alice.accept_all().await.unwrap();
    World {
        gw,
        alice,
        pypi,
        other_port,
        tls,
        internal,
    }
}

async fn python(client: &Client, program: &str) -> Value {
    let request = json!({"command": ["python3", "-c", program], "root_id": "main", "cwd": ""});
    client.request("shell.exec", request).await.unwrap()
}

fn stdout(r: &Value) -> String {
    r["stdout"].as_str().unwrap_or_default().trim().to_string()
}

/// Fetches `url` with urllib, which follows the proxy variables; prints
/// the body, or `HTTP <code> <reason>`, or the error.
fn fetch(url: &str) -> String {
    format!(
        "import urllib.request, urllib.error, ssl\n\
         ctx = ssl.create_default_context(cafile='ca.pem')\n\
         try:\n    print(urllib.request.urlopen({url:?}, timeout=20, context=ctx).read().decode())\n\
         except urllib.error.HTTPError as e: print('HTTP', e.code, e.read().decode().strip())\n\
         except Exception as e: print('ERROR', e)"
    )
}

fn egress_entries(gw: &Gateway) -> Vec<portcullis_store::Entry> {
    gw.audit_entries()
        .into_iter()
        .filter(|e| matches!(e.record.kind, Kind::Egress | Kind::EgressStart))
        .collect()
}

#[tokio::test]
async fn an_allowed_name_is_reached_over_http_and_https_and_each_connection_is_audited() {
    let w = world().await;
    let url = format!("http://pypi.test:{}/simple/", w.pypi.addr.port());
    let r = python(&w.alice, &fetch(&url)).await;
    assert_eq!(stdout(&r), "hello from pypi", "{r}");
    let url = format!("https://pypi.test:{}/", w.tls.addr.port());
    let r = python(&w.alice, &fetch(&url)).await;
    assert_eq!(stdout(&r), "hello over tls", "{r}");
    assert_eq!(w.pypi.connections.load(Ordering::SeqCst), 1);
    assert_eq!(w.tls.connections.load(Ordering::SeqCst), 1);

    let entries = egress_entries(&w.gw);
    for (method, port) in [
        ("egress.http", w.pypi.addr.port()),
        ("egress.connect", w.tls.addr.port()),
    ] {
        let destination = format!("pypi.test:{port}");
        let of_it: Vec<_> = entries
            .iter()
            .filter(|e| e.record.destination.as_deref() == Some(&destination))
            .collect();
        assert_eq!(of_it.len(), 2, "{of_it:#?}");
        let closed = of_it
            .iter()
            .find(|e| e.record.kind == Kind::Egress)
            .unwrap();
        let started = of_it
            .iter()
            .find(|e| e.record.kind == Kind::EgressStart)
            .unwrap();
        assert!(started.seq < closed.seq);
        assert_eq!(closed.record.method.as_deref(), Some(method));
        assert_eq!(closed.record.decision, Some(Decision::Allowed));
        assert_eq!(closed.record.principal.as_deref(), Some("alice"));
        assert_eq!(closed.record.rule.as_deref(), Some(destination.as_str()));
        assert!(
            closed.record.bytes_in > 0 && closed.record.bytes_out > 0,
            "{closed:?}"
        );
        // Linked to the command's request.
        assert!(closed.record.request_id.is_some());
    }
    w.gw.assert_requests_audited(2);
}

#[tokio::test]
async fn unlisted_names_private_addresses_raw_ips_and_other_ports_are_refused() {
    let w = world().await;
    let cases = [
        // A name not in the list (it resolves to a listed address).
        (
            format!("http://unlisted.test:{}/", w.pypi.addr.port()),
            "not in the grant's egress allow-list",
        ),
        // A listed name that resolves to a private address no entry covers.
        (
            format!("http://internal.test:{}/", w.internal.addr.port()),
            "not public",
        ),
        // A raw IP no address entry covers.
        (
            format!("http://127.0.0.3:{}/", w.internal.addr.port()),
            "not in the grant's egress allow-list",
        ),
        // A listed name on a port its entry does not name.
        (
            format!("http://pypi.test:{}/", w.other_port.addr.port()),
            "not in the grant's egress allow-list",
        ),
        (
            format!("https://pypi.test:{}/", w.other_port.addr.port()),
            "Tunnel connection failed: 403",
        ),
    ];
    for (url, why) in &cases {
        let r = python(&w.alice, &fetch(url)).await;
        let out = stdout(&r);
        assert!(
            out.starts_with("HTTP 403") || out.starts_with("ERROR"),
            "{url}: {r}"
        );
        assert!(out.contains(why), "{url}: {out}");
    }
    assert_eq!(w.internal.connections.load(Ordering::SeqCst), 0);
    assert_eq!(w.other_port.connections.load(Ordering::SeqCst), 0);
    assert_eq!(w.pypi.connections.load(Ordering::SeqCst), 0);
    let refused: Vec<_> = egress_entries(&w.gw)
        .into_iter()
        .filter(|e| e.record.decision == Some(Decision::Blocked))
        .collect();
    assert_eq!(refused.len(), cases.len(), "{refused:#?}");
    assert!(refused.iter().all(|e| e.record.kind == Kind::Egress
        && e.record.error_code.as_deref() == Some("egress_refused")));
    assert!(
        egress_entries(&w.gw)
            .iter()
            .all(|e| e.record.kind != Kind::EgressStart)
    );
    w.gw.assert_requests_audited(cases.len());
}

#[tokio::test]
async fn a_tunnel_whose_tls_names_another_server_carries_nothing() {
    let w = world().await;
    let program = format!(
        "import socket, ssl\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT pypi.test:{port} HTTP/1.1\\r\\nHost: pypi.test:{port}\\r\\n\\r\\n')\n\
         print(s.recv(4096).split(b'\\r\\n')[0].decode())\n\
         ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n\
         try:\n    ctx.wrap_socket(s, server_hostname='evil.test'); print('HANDSHAKE')\n\
         except Exception as e: print('closed', type(e).__name__)",
        port = w.tls.addr.port()
    );
    let r = python(&w.alice, &program).await;
    let out = stdout(&r);
    assert!(out.starts_with("HTTP/1.1 200"), "{r}");
    assert!(out.contains("closed") && !out.contains("HANDSHAKE"), "{r}");
    // The proxy connected (the start entry) but sent nothing upstream.
    let entries = egress_entries(&w.gw);
    let closed = entries
        .iter()
        .find(|e| e.record.kind == Kind::Egress)
        .unwrap();
    assert_eq!(closed.record.decision, Some(Decision::Blocked));
    assert_eq!(closed.record.bytes_out, 0, "{closed:?}");
    assert!(
        closed
            .record
            .detail
            .as_deref()
            .unwrap_or_default()
            .contains("evil.test"),
        "{closed:?}"
    );
    w.gw.assert_requests_audited(1);
}

#[tokio::test]
async fn without_the_proxy_nothing_leaves_not_even_udp() {
    let w = world().await;
    let udp = UdpSocket::bind("127.0.0.2:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    // Straight to the listed server's address and port, ignoring the
    // proxy variables; then UDP to the host's listener.
    let program = format!(
        "import socket\n\
         try:\n    socket.create_connection(('127.0.0.2', {port}), timeout=5); print('CONNECTED')\n\
         except OSError as e: print('tcp refused', e.errno)\n\
         try:\n    socket.create_connection(('192.0.2.1', 80), timeout=5); print('CONNECTED')\n\
         except OSError as e: print('tcp refused', e.errno)\n\
         u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         try:\n    u.sendto(b'leak', ('127.0.0.2', {udp})); print('udp sent')\n\
         except OSError as e: print('udp refused', e.errno)",
        port = w.pypi.addr.port(),
        udp = udp.local_addr().unwrap().port(),
    );
    let r = python(&w.alice, &program).await;
    let out = stdout(&r);
    assert!(!out.contains("CONNECTED"), "{r}");
    assert_eq!(out.matches("tcp refused").count(), 2, "{r}");
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram left the world: {r}"
    );
    assert_eq!(w.pypi.connections.load(Ordering::SeqCst), 0);
    assert!(egress_entries(&w.gw).is_empty());
    w.gw.assert_requests_audited(1);
}

#[tokio::test]
async fn a_terminal_s_command_goes_through_its_own_proxy_too() {
    let w = world().await;
    let url = format!("http://pypi.test:{}/", w.pypi.addr.port());
    let request = json!({
        "command": ["python3", "-c", fetch(&url)],
        "pty": true,
        "root_id": "main",
        "cwd": "",
    });
    let mut start = w.alice.start("shell.start", request).await.unwrap();
    let mut output = Vec::new();
    while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(30), start.next()).await {
        if let portcullis_client::StreamItem::Chunk { data, .. } = item {
            output.extend_from_slice(&data);
        }
    }
    let output = String::from_utf8_lossy(&output).to_string();
    let result = tokio::time::timeout(Duration::from_secs(30), start.response())
        .await
        .expect("the terminal's command ends")
        .unwrap();
    assert_eq!(result["exit_code"], 0, "{result}: {output}");
    assert!(output.contains("hello from pypi"), "{output}");
    assert_eq!(w.pypi.connections.load(Ordering::SeqCst), 1);
    let destination = format!("pypi.test:{}", w.pypi.addr.port());
    let closed: Vec<_> = egress_entries(&w.gw)
        .into_iter()
        .filter(|e| e.record.kind == Kind::Egress)
        .collect();
    assert_eq!(closed.len(), 1, "{closed:#?}");
    assert_eq!(
        closed[0].record.destination.as_deref(),
        Some(destination.as_str())
    );
    assert!(closed[0].record.bytes_in > 0);
    w.gw.assert_requests_audited(1);
}
