//! A throwaway OpenSSH server on 127.0.0.1 with its own config, host key
//! and client key, and the `ssh`/`scp` command lines that reach it. It is
//! stopped (by its PID) when dropped, with everything it started.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::measure;

pub const SSHD: &str = "/usr/sbin/sshd";

pub struct Sshd {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// The ControlMaster's socket, once one is open.
    control: Option<PathBuf>,
}

/// Installs openssh-server with apt-get (when asked to and it is missing),
/// updating the package lists first if the install fails without them.
/// The package must not start the system's sshd (on port 22, every
/// address): a `policy-rc.d` that forbids starting services is in place
/// while apt-get runs, unless the host already has one.
pub fn install() -> Result<(), String> {
    if Path::new(SSHD).exists() {
        return Ok(());
    }
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists();
    if ours {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(
            policy,
            "#!/bin/sh\n# portcullis-bench: no service starts\nexit 101\n",
        )
        .and_then(|()| std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| format!("{}: {e}", policy.display()))?;
    }
    let installed = apt_install();
    if ours {
        let _ = std::fs::remove_file(policy);
    }
    installed
}

fn apt_install() -> Result<(), String> {
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("apt-get: {e}"))
    };
    let install = ["install", "-y", "--no-install-recommends", "openssh-server"];
    if apt(&install)?.success() {
        return Ok(());
    }
    apt(&["update", "-q"])?;
    match apt(&install)? {
        status if status.success() => Ok(()),
        status => Err(format!("apt-get install openssh-server: {status}")),
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

impl Sshd {
    pub fn start(dir: &Path) -> Result<Self, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
        std::fs::create_dir_all(dir).map_err(|e| fail("the ssh directory", &e))?;
        // Privilege separation wants this directory.
        std::fs::create_dir_all("/run/sshd").map_err(|e| fail("/run/sshd", &e))?;
        for key in ["host", "client"] {
            let _ = std::fs::remove_file(dir.join(key));
            let status = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .status()
                .map_err(|e| fail("ssh-keygen", &e))?;
            if !status.success() {
                return Err(format!("ssh-keygen: {status}"));
            }
        }
        let port = free_port()?;
        // Commands run as this user through its login shell. Debian's bash
        // reads ~/.bashrc for a command sshd runs unless SHLVL says it is
        // nested, and root's may do anything (pyenv's hooks here take
        // 110 ms): `SetEnv SHLVL=1` makes ssh run `true` as it would for a
        // user with a plain shell.
        let config = format!(
            "ListenAddress 127.0.0.1\nPort {port}\nHostKey {dir}/host\n\
             AuthorizedKeysFile {dir}/client.pub\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n\
             StrictModes no\nUseDNS no\nMaxStartups 4000\nMaxSessions 100\nSetEnv SHLVL=1\n\
             PidFile {dir}/sshd.pid\nSubsystem sftp /usr/lib/openssh/sftp-server\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("sshd_config"), config).map_err(|e| fail("sshd_config", &e))?;
        let child = Command::new(SSHD)
            .arg("-D")
            .arg("-f")
            .arg(dir.join("sshd_config"))
            .arg("-E")
            .arg(dir.join("sshd.log"))
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| fail("starting sshd", &e))?;
        let sshd = Self {
            child,
            port,
            dir: dir.to_path_buf(),
            control: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "sshd did not listen (see {}/sshd.log)",
                    dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let probe = sshd
            .ssh()
            .arg("true")
            .output()
            .map_err(|e| fail("ssh", &e))?;
        if !probe.status.success() {
            return Err(format!(
                "ssh to the bench sshd failed: {}",
                String::from_utf8_lossy(&probe.stderr).trim()
            ));
        }
        Ok(sshd)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn options(&self, port_flag: &str) -> Vec<String> {
        let key = self.dir.join("client");
        [
            port_flag,
            &self.port.to_string(),
            "-i",
            &key.display().to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ControlMaster=no",
        ]
        .map(String::from)
        .to_vec()
    }

    /// `ssh -p PORT … ` for a new connection, ready for a host and command.
    pub fn ssh(&self) -> Command {
        let mut command = Command::new("ssh");
        command
            .args(self.options("-p"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command.arg("-o").arg("ControlPath=none").arg("127.0.0.1");
        command
    }

    /// `ssh` over the ControlMaster connection (opened on first use).
    pub fn ssh_muxed(&mut self) -> Result<Command, String> {
        let socket = self.dir.join("control");
        if self.control.is_none() {
            let status = Command::new("ssh")
                .args(self.options("-p"))
                .args(["-f", "-N", "-M", "-S"])
                .arg(&socket)
                .arg("127.0.0.1")
                .stdin(Stdio::null())
                .status()
                .map_err(|e| format!("ssh -M: {e}"))?;
            if !status.success() {
                return Err(format!("ssh -M: {status}"));
            }
            self.control = Some(socket.clone());
        }
        let mut command = Command::new("ssh");
        command
            .args(self.options("-p"))
            .arg("-S")
            .arg(&socket)
            .arg("127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        Ok(command)
    }

    /// `scp -P PORT …`, ready for its two paths (the host is `127.0.0.1`).
    pub fn scp(&self) -> Command {
        let mut command = Command::new("scp");
        command
            .args(self.options("-P"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    }

    /// The sshd processes: the listener and one or two per connection.
    pub fn processes(&self) -> Vec<u32> {
        measure::process_tree(self.pid())
    }

    /// Waits until sshd holds no connection but `keep` (its children have
    /// exited and been reaped, so their CPU time is counted).
    pub fn wait_for_connections(&self, keep: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.processes().len() > 1 + keep && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The negotiated cipher, as `ssh -v` reports it.
    pub fn cipher(&self) -> String {
        let out = self.ssh().arg("-v").arg("true").output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned());
        text.unwrap_or_default()
            .lines()
            .find_map(|l| l.split("cipher: ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or("the default")
            .to_string()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        if let Some(socket) = &self.control {
            let _ = Command::new("ssh")
                .args(["-S"])
                .arg(socket)
                .args(["-O", "exit", "127.0.0.1"])
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The OpenSSH version (`ssh -V`).
pub fn version() -> String {
    Command::new("ssh")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default()
}
