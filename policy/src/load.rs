//! Parse and validate: TOML text → [`Policy`], or every problem found, each
//! with file, line and column.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::model::*;
use crate::path::check_virtual_root;
use crate::schema::*;
use crate::{PolicyError, PolicyErrors};

/// Longest id of a principal, root, grant or tool.
const MAX_ID_LEN: usize = 64;

/// Parses and validates policy text. `file` names the source in errors;
/// `base_dir` resolves relative tool script paths (lexically; nothing is read).
pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Policy, PolicyErrors> {
    let raw: RawPolicy = toml::from_str(text).map_err(|e| {
        let span = e.span().unwrap_or(0..0);
        PolicyErrors(vec![PolicyError::at(
            file,
            text,
            span,
            e.message().trim_end().to_string(),
        )])
    })?;
    let mut v = Validator {
        file,
        text,
        errors: Vec::new(),
        seen: HashMap::new(),
        unix_uids: HashMap::new(),
    };
    let policy = v.policy(raw, base_dir, hex::encode(Sha256::digest(text.as_bytes())));
    if v.errors.is_empty() {
        Ok(policy)
    } else {
        Err(PolicyErrors(v.errors))
    }
}

/// Reads and parses a policy file: the one file this crate ever reads.
pub fn load_file(path: &Path) -> Result<Policy, PolicyErrors> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        PolicyErrors(vec![PolicyError {
            file: file.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        }])
    })?;
    let base = path.parent().unwrap_or(Path::new("/"));
    parse(&text, &file, base)
}

struct Validator<'a> {
    file: &'a str,
    text: &'a str,
    errors: Vec<PolicyError>,
    /// (kind, id) → line of its first definition, to report duplicates.
    seen: HashMap<(&'static str, String), usize>,
    /// unix_uid → the principal that has it.
    unix_uids: HashMap<u32, String>,
}

/// The ids that references may name.
struct Known<'a> {
    principals: &'a BTreeSet<&'a str>,
    roots: &'a BTreeSet<&'a str>,
}

impl Validator<'_> {
    fn error(&mut self, span: Range<usize>, message: String) {
        self.errors
            .push(PolicyError::at(self.file, self.text, span, message));
    }

    fn policy(&mut self, raw: RawPolicy, base_dir: &Path, generation: String) -> Policy {
        let principals: Vec<Principal> = raw
            .principal
            .into_iter()
            .map(|p| self.principal(p))
            .collect();
        let spanned_roots: Vec<(Root, Range<usize>)> =
            raw.root.into_iter().map(|r| self.root(r)).collect();
        self.no_nested_roots(&spanned_roots);
        let roots: Vec<Root> = spanned_roots.into_iter().map(|(root, _)| root).collect();
        let principal_ids: BTreeSet<&str> = principals.iter().map(|p| p.id.as_str()).collect();
        let root_ids: BTreeSet<&str> = roots.iter().map(|r| r.id.as_str()).collect();
        let known = Known {
            principals: &principal_ids,
            roots: &root_ids,
        };
        let grants = raw
            .grant
            .into_iter()
            .map(|g| self.grant(g, &known))
            .collect();
        let mcp_servers: Vec<McpServer> = raw
            .mcp_server
            .into_iter()
            .map(|m| self.mcp_server(m, &known))
            .collect();
        let server_names: BTreeSet<&str> = mcp_servers.iter().map(|m| m.name.as_str()).collect();
        let tools = raw
            .tool
            .into_iter()
            .map(|t| self.tool(t, base_dir, &server_names))
            .collect();
        Policy {
            generation: generation.into(),
            principals,
            roots,
            grants,
            tools,
            mcp_servers,
        }
    }

    fn principal(&mut self, raw: RawPrincipal) -> Principal {
        let id = self.id("principal", &raw.id);
        let public_key = raw.public_key.and_then(|key| {
            let decoded = decode_base64(key.get_ref());
            let bytes: Option<[u8; 32]> = decoded.and_then(|b| b.try_into().ok());
            if bytes.is_none() {
                self.error(
                    key.span(),
                    format!("principal `{id}`: public_key is not 32 bytes of base64"),
                );
            }
            bytes
        });
        let token_sha256 = raw.token_hash.and_then(|hash| {
            let parsed = parse_token_hash(hash.get_ref());
            if parsed.is_none() {
                self.error(
                    hash.span(),
                    format!("principal `{id}`: token_hash must be `sha256:` and 64 hex digits (see `portcullis token new`)"),
                );
            }
            parsed
        });
        let unix_uid = raw.unix_uid.map(|uid| {
            let (span, uid) = (uid.span(), *uid.get_ref());
            if let Some(other) = self.unix_uids.insert(uid, id.clone()) {
                self.error(
                    span,
                    format!("principal `{id}`: unix_uid {uid} is principal `{other}`'s already"),
                );
            }
            uid
        });
        if public_key.is_none() && token_sha256.is_none() && unix_uid.is_none() && !raw.disabled {
            self.error(
                raw.id.span(),
                format!(
                    "principal `{id}` has neither public_key, token_hash nor unix_uid, so nobody can be it"
                ),
            );
        }
        Principal {
            id,
            description: raw.description,
            public_key,
            token_sha256,
            unix_uid,
            expires_at: raw.expires_at.map(|e| e.0),
            disabled: raw.disabled,
        }
    }

    /// The root, and the span of its virtual path for later checks.
    fn root(&mut self, raw: RawRoot) -> (Root, Range<usize>) {
        let id = self.id("root", &raw.id);
        let host = Path::new(raw.path.get_ref());
        let normal = host.is_absolute()
            && host
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
            && !raw.path.get_ref().contains('\0');
        if !normal {
            self.error(
                raw.path.span(),
                format!("root `{id}`: path must be absolute, without `.` or `..`"),
            );
        } else if host == Path::new("/") {
            self.error(
                raw.path.span(),
                format!("root `{id}`: path must not be `/`: grant a directory, not the whole host"),
            );
        }
        if let Err(why) = check_virtual_root(raw.virtual_path.get_ref()) {
            self.error(
                raw.virtual_path.span(),
                format!("root `{id}`: virtual_path {why}"),
            );
        }
        let span = raw.virtual_path.span();
        let root = Root {
            id,
            description: raw.description,
            host_path: host.components().collect(),
            virtual_path: raw.virtual_path.into_inner(),
            follow_symlinks: raw.follow_symlinks,
        };
        (root, span)
    }

    /// Two roots whose virtual paths nest would make an absolute virtual
    /// path ambiguous.
    fn no_nested_roots(&mut self, roots: &[(Root, Range<usize>)]) {
        for (i, (a, _)) in roots.iter().enumerate() {
            for (b, span) in &roots[i + 1..] {
                let (va, vb) = (
                    format!("{}/", a.virtual_path),
                    format!("{}/", b.virtual_path),
                );
                if va.starts_with(&vb) || vb.starts_with(&va) {
                    self.error(
                        span.clone(),
                        format!(
                            "roots `{}` and `{}` have nested virtual paths; make them disjoint",
                            a.id, b.id
                        ),
                    );
                }
            }
        }
    }

    fn grant(&mut self, raw: RawGrant, known: &Known) -> Grant {
        let id = self.id("grant", &raw.id);
        let mut principals = Vec::new();
        if raw.principals.get_ref().is_empty() {
            self.error(
                raw.principals.span(),
                format!("grant `{id}`: principals is empty, so it grants nothing"),
            );
        }
        for p in raw.principals.into_inner() {
            if !known.principals.contains(p.get_ref().as_str()) {
                self.error(
                    p.span(),
                    format!("grant `{id}`: principal `{}` is not defined", p.get_ref()),
                );
            }
            principals.push(p.into_inner());
        }
        let mut fileops = BTreeMap::new();
        for (root, mode) in raw.fileops {
            self.known_root(&format!("grant `{id}`"), &root, known);
            fileops.insert(root.into_inner(), mode);
        }
        let shell = raw.shell.map(|s| self.shell(&id, s, known));
        let tools = raw.tools.map(|t| self.tools(&id, t));
        let scripts = raw.scripts.map(scripts);
        let resources = raw.resources.map(|r| ResourcesGrant {
            max_resources: r
                .max_resources
                .unwrap_or(crate::decide::DEFAULT_MAX_RESOURCES),
        });
        let artifacts = raw.artifacts.map(|a| self.artifacts(&id, a));
        if fileops.is_empty()
            && shell.is_none()
            && tools.is_none()
            && scripts.is_none()
            && resources.is_none()
            && artifacts.is_none()
        {
            self.error(raw.id.span(), format!("grant `{id}` grants no capability (add fileops, shell, tools, scripts, resources or artifacts)"));
        }
        Grant {
            id,
            description: raw.description,
            principals,
            expires_at: raw.expires_at.map(|e| e.0),
            fileops,
            shell,
            tools,
            scripts,
            resources,
            artifacts,
        }
    }

    fn artifacts(&mut self, grant: &str, raw: RawArtifacts) -> ArtifactsGrant {
        let mut mime_types = Vec::new();
        if raw.mime_types.get_ref().is_empty() {
            self.error(
                raw.mime_types.span(),
                format!("grant `{grant}`: artifacts.mime_types is empty (name the types, e.g. \"text/*\", or \"*/*\" for any)"),
            );
        }
        for pattern in raw.mime_types.into_inner() {
            let text = pattern.get_ref().trim().to_ascii_lowercase();
            let valid = text.split_once('/').is_some_and(|(kind, sub)| {
                let token = |t: &str| {
                    !t.is_empty()
                        && t.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "!#$&-^_.+".contains(c))
                };
                (kind == "*" && sub == "*") || (token(kind) && (sub == "*" || token(sub)))
            });
            if valid {
                mime_types.push(text);
            } else {
                self.error(
                    pattern.span(),
                    format!("grant `{grant}`: `{}` is not a MIME type pattern (`type/subtype`, `type/*` or `*/*`)", pattern.get_ref()),
                );
            }
        }
        if raw.destinations.get_ref().is_empty() {
            self.error(
                raw.destinations.span(),
                format!("grant `{grant}`: artifacts.destinations is empty: name the runtime's storage, e.g. [\"storage.example.com\"] (an egress allow-list entry each)"),
            );
        }
        let mut entries = Vec::new();
        for entry in raw.destinations.into_inner() {
            match crate::egress::Egress::parse([entry.get_ref().as_str()]) {
                Ok(parsed) => entries.extend(parsed.entries),
                Err(e) => self.error(
                    entry.span(),
                    format!("grant `{grant}`: artifacts.destinations: {e}"),
                ),
            }
        }
        ArtifactsGrant {
            mime_types,
            max_size: raw.max_size.map_or(DEFAULT_ARTIFACT_MAX_SIZE, |s| s.0),
            destinations: crate::egress::Egress { entries },
        }
    }

    /// `owner` says whose reference it is: "grant `dev`".
    fn known_root(&mut self, owner: &str, root: &Spanned<String>, known: &Known) {
        if !known.roots.contains(root.get_ref().as_str()) {
            self.error(
                root.span(),
                format!("{owner}: root `{}` is not defined", root.get_ref()),
            );
        }
    }

    fn shell(&mut self, grant: &str, raw: RawShell, known: &Known) -> ShellGrant {
        let listed: Vec<Spanned<String>> = raw.commands.into_inner();
        let commands = if listed.iter().any(|c| c.get_ref() == "*") {
            CommandRule::Any
        } else {
            for c in &listed {
                let bad = c.get_ref().is_empty()
                    || c.get_ref().contains('\0')
                    || (c.get_ref().contains('/') && !c.get_ref().starts_with('/'));
                if bad {
                    self.error(c.span(), format!("grant `{grant}`: command `{}` must be a bare program name or an absolute path", c.get_ref()));
                }
            }
            CommandRule::Listed(listed.into_iter().map(Spanned::into_inner).collect())
        };
        for root in &raw.cwd_roots {
            self.known_root(&format!("grant `{grant}`"), root, known);
        }
        for name in raw.env_allow.iter().chain(raw.env_set.keys()) {
            self.env_name(&format!("grant `{grant}`"), name);
        }
        if let Some(n) = &raw.max_open_files
            && *n.get_ref() < 16
        {
            self.error(
                n.span(),
                format!("grant `{grant}`: max_open_files must be at least 16 (a program needs a few to start)"),
            );
        }
        if let Some(size) = &raw.max_tmp
            && size.get_ref().0 == 0
        {
            self.error(
                size.span(),
                format!(
                    "grant `{grant}`: max_tmp must be more than 0 (a tmpfs of size 0 is unbounded)"
                ),
            );
        }
        let cpu_millis = raw.max_cpu.map(|cpu| {
            let value = *cpu.get_ref();
            if !(0.01..=4096.0).contains(&value) {
                self.error(
                    cpu.span(),
                    format!("grant `{grant}`: max_cpu is a number of CPUs from 0.01 to 4096, e.g. 0.5 or 2"),
                );
            }
            (value.clamp(0.01, 4096.0) * 1000.0).round() as u64
        });
        let pids = raw.max_pids.map(|pids| {
            if *pids.get_ref() == 0 {
                self.error(
                    pids.span(),
                    format!("grant `{grant}`: max_pids must be at least 1"),
                );
            }
            pids.into_inner()
        });
        let mut approval = Vec::new();
        let mut approval_matchers = Vec::new();
        for (pattern, policy) in raw.approval {
            if let Some(glob) = self.glob_of("command", grant, &pattern, false) {
                approval_matchers.push(glob.compile_matcher());
                approval.push((pattern.into_inner(), policy));
            }
        }
        let survive_revocation = raw.survive_revocation.map(|s| {
            if *s.get_ref() && !raw.persist {
                self.error(
                s.span(),
                format!("grant `{grant}`: survive_revocation needs persist = true (a process that does not persist ends with the request that started it)"),
                );
            }
            s.into_inner()
        });
        let max_processes = raw.max_processes.map(|m| {
            if *m.get_ref() == 0 {
                self.error(
                    m.span(),
                    format!("grant `{grant}`: max_processes must be at least 1"),
                );
            }
            m.into_inner()
        });
        ShellGrant {
            commands,
            cwd_roots: raw.cwd_roots.into_iter().map(Spanned::into_inner).collect(),
            env_allow: raw.env_allow.into_iter().map(Spanned::into_inner).collect(),
            env_set: raw
                .env_set
                .into_iter()
                .map(|(k, v)| (k.into_inner(), v))
                .collect(),
            max_runtime: raw
                .max_runtime
                .map_or(std::time::Duration::from_secs(600), |d| d.0),
            output_limit: raw.output_limit.map_or(16 << 20, |s| s.0),
            pty: raw.pty,
            network: raw.network.map_or(Network::Deny, |network| {
                self.network(&format!("grant `{grant}`"), network)
            }),
            max_processes: max_processes.unwrap_or(4),
            persist: raw.persist,
            idle_timeout: raw
                .idle_timeout
                .map_or(std::time::Duration::from_secs(600), |d| d.0),
            limits: ProcessLimits {
                memory: raw.max_memory.map(|s| s.0),
                file_size: raw.max_file_size.map(|s| s.0),
                tmp: raw.max_tmp.map(|s| s.into_inner().0),
                open_files: raw.max_open_files.map(Spanned::into_inner),
                cpu_millis,
                pids,
            },
            sandbox: raw.sandbox,
            survive_revocation: survive_revocation.unwrap_or(false),
            approval,
            approval_matchers,
        }
    }

    fn network(&mut self, owner: &str, raw: Spanned<RawNetwork>) -> Network {
        let span = raw.span();
        match raw.into_inner() {
            RawNetwork::Word(word) if word == "allow" => Network::Allow,
            RawNetwork::Word(word) if word == "deny" => Network::Deny,
            RawNetwork::Word(word) => {
                self.error(
                    span,
                    format!(
                        "{owner}: network = \"{word}\": expected \"deny\", \"allow\" \
                         or {{ allow = [\"pypi.org\", \"*.github.com:443\", ...] }}"
                    ),
                );
                Network::Deny
            }
            RawNetwork::AllowList(list) => {
                match crate::egress::Egress::parse(list.allow.iter().map(String::as_str)) {
                    Ok(egress) => Network::Egress(std::sync::Arc::new(egress)),
                    Err(e) => {
                        self.error(span, format!("{owner}: network allow-list: {e}"));
                        Network::Deny
                    }
                }
            }
        }
    }

    fn tools(&mut self, grant: &str, raw: RawTools) -> ToolsGrant {
        let mut builder = globset::GlobSetBuilder::new();
        for pattern in &raw.allow {
            if let Some(glob) = self.glob(grant, pattern) {
                builder.add(glob);
            }
        }
        let allow_set = builder
            .build()
            .unwrap_or_else(|_| globset::GlobSet::empty());
        let mut approval = Vec::new();
        let mut approval_matchers = Vec::new();
        for (pattern, policy) in raw.approval {
            if let Some(glob) = self.glob(grant, &pattern) {
                approval_matchers.push(glob.compile_matcher());
                approval.push((pattern.into_inner(), policy));
            }
        }
        ToolsGrant {
            allow: raw.allow.into_iter().map(Spanned::into_inner).collect(),
            allow_set,
            approval,
            approval_matchers,
        }
    }

    fn glob(&mut self, grant: &str, pattern: &Spanned<String>) -> Option<globset::Glob> {
        self.glob_of("tool", grant, pattern, true)
    }

    /// A glob of a grant's; `*` crosses `/` unless `separated` (tool
    /// names keep it; a command line's arguments are paths).
    fn glob_of(
        &mut self,
        what: &str,
        grant: &str,
        pattern: &Spanned<String>,
        separated: bool,
    ) -> Option<globset::Glob> {
        match globset::GlobBuilder::new(pattern.get_ref())
            .literal_separator(separated)
            .build()
        {
            Ok(glob) => Some(glob),
            Err(e) => {
                self.error(
                    pattern.span(),
                    format!(
                        "grant `{grant}`: {what} pattern `{}`: {}",
                        pattern.get_ref(),
                        e.kind()
                    ),
                );
                None
            }
        }
    }

    fn tool(&mut self, raw: RawTool, base_dir: &Path, servers: &BTreeSet<&str>) -> Tool {
        let name = self.id("tool", &raw.name);
        let schema =
            serde_json::to_value(raw.input_schema.get_ref()).unwrap_or(serde_json::Value::Null);
        if let Err(e) = jsonschema::validator_for(&schema) {
            self.error(
                raw.input_schema.span(),
                format!("tool `{name}`: input_schema is not a valid JSON Schema: {e}"),
            );
        }
        let action = match (raw.script, raw.mcp) {
            (Some(script), None) => ToolAction::Script(self.tool_script(&name, &script, base_dir)),
            (None, Some(mcp)) => {
                let span = mcp.span();
                let RawMcpTool { server, tool } = mcp.into_inner();
                if !servers.contains(server.get_ref().as_str()) {
                    self.error(
                        server.span(),
                        format!(
                            "tool `{name}`: mcp_server `{}` is not defined (add an [[mcp_server]] with that name)",
                            server.get_ref()
                        ),
                    );
                }
                if !raw.secrets.is_empty() {
                    self.error(
                        span.clone(),
                        format!("tool `{name}`: an MCP server's tool has no secrets of its own; give them to the server (`[[mcp_server]] secrets`)"),
                    );
                }
                let tool = tool.map_or_else(|| name.clone(), Spanned::into_inner);
                if tool.is_empty() || tool.len() > 128 {
                    self.error(
                        span,
                        format!("tool `{name}`: mcp.tool must be 1 to 128 characters"),
                    );
                }
                ToolAction::Mcp {
                    server: server.into_inner(),
                    tool,
                }
            }
            (script, _) => {
                let span = script.map_or(raw.name.span(), |s| s.span());
                self.error(
                    span,
                    format!("tool `{name}`: give either `script` (a Rhai file) or `mcp = {{ server = \"…\", tool = \"…\" }}`, exactly one"),
                );
                ToolAction::Script(PathBuf::new())
            }
        };
        let mut secrets = Vec::new();
        for secret in raw.secrets {
            secrets.push(self.secret_name(&format!("tool `{name}`"), secret));
        }
        Tool {
            name,
            title: raw.title,
            description: raw.description,
            input_schema: schema,
            risk: raw.risk,
            approval_policy: raw.approval_policy,
            action,
            secrets,
        }
    }

    /// A tool's script path: relative ones from the policy's directory.
    fn tool_script(&mut self, name: &str, raw: &Spanned<String>, base_dir: &Path) -> PathBuf {
        let script = Path::new(raw.get_ref());
        if raw.get_ref().is_empty() || script.components().any(|c| c == Component::ParentDir) {
            self.error(
                raw.span(),
                format!("tool `{name}`: script must be a path without `..`"),
            );
        }
        if script.is_absolute() {
            script.to_path_buf()
        } else {
            base_dir.join(script)
        }
    }

    fn mcp_server(&mut self, raw: RawMcpServer, known: &Known) -> McpServer {
        let name = self.id("mcp_server", &raw.name);
        let owner = format!("mcp_server `{name}`");
        let bearer_secret = raw.bearer_secret;
        if let (Some(_), Some(secret)) = (&raw.command, &bearer_secret) {
            self.error(
                secret.span(),
                format!("{owner}: bearer_secret is for a `url` server; give a started one its secrets in `secrets`"),
            );
        }
        let reach = match (raw.command, raw.url) {
            (Some(command), None) => McpReach::Start {
                command: self.mcp_command(&owner, command),
            },
            (None, Some(url)) => {
                if let Err(why) = check_loopback_url(url.get_ref()) {
                    self.error(url.span(), format!("{owner}: url {why}"));
                }
                let started_only = [
                    ("roots", !raw.roots.is_empty()),
                    ("cwd", raw.cwd.is_some()),
                    ("env", !raw.env.is_empty()),
                    ("secrets", !raw.secrets.is_empty()),
                    ("network", raw.network.is_some()),
                    ("max_memory", raw.max_memory.is_some()),
                    ("max_pids", raw.max_pids.is_some()),
                ];
                for (key, _) in started_only.iter().filter(|(_, set)| *set) {
                    self.error(
                        url.span(),
                        format!("{owner}: `{key}` is for a server the gateway starts (`command`), not one it reaches at a url"),
                    );
                }
                McpReach::Http {
                    url: url.into_inner(),
                    bearer_secret: bearer_secret.map(|secret| self.secret_name(&owner, secret)),
                }
            }
            (command, url) => {
                let span = url
                    .map(|u| u.span())
                    .or(command.map(|c| c.span()))
                    .unwrap_or(raw.name.span());
                self.error(
                    span,
                    format!("{owner}: give either `command` (a server the gateway starts) or `url` (one on loopback it reaches), exactly one"),
                );
                McpReach::Start {
                    command: Vec::new(),
                }
            }
        };
        let mut roots = BTreeMap::new();
        for (root, mode) in raw.roots {
            self.known_root(&owner, &root, known);
            roots.insert(root.into_inner(), mode);
        }
        if let Some(cwd) = &raw.cwd
            && !roots.contains_key(cwd.get_ref())
        {
            self.error(
                cwd.span(),
                format!("{owner}: cwd `{}` must be one of its roots", cwd.get_ref()),
            );
        }
        let mut env = BTreeMap::new();
        for (key, value) in raw.env {
            self.env_name(&owner, &key);
            env.insert(key.into_inner(), value);
        }
        env.entry("PATH".to_string())
            .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".to_string());
        let mut secrets = BTreeMap::new();
        for (key, secret) in raw.secrets {
            self.env_name(&owner, &key);
            if env.contains_key(key.get_ref()) {
                self.error(
                    key.span(),
                    format!(
                        "{owner}: `{}` is set by both env and secrets",
                        key.get_ref()
                    ),
                );
            }
            let secret = self.secret_name(&owner, secret);
            secrets.insert(key.into_inner(), secret);
        }
        let pids = raw.max_pids.map(|pids| {
            if *pids.get_ref() == 0 {
                self.error(pids.span(), format!("{owner}: max_pids must be at least 1"));
            }
            pids.into_inner()
        });
        McpServer {
            name,
            description: raw.description,
            reach,
            roots,
            cwd: raw.cwd.map(Spanned::into_inner),
            env,
            secrets,
            network: raw
                .network
                .map_or(Network::Deny, |network| self.network(&owner, network)),
            call_timeout: raw
                .call_timeout
                .map_or(std::time::Duration::from_secs(60), |d| d.0),
            // Threads count: a server's runtime starts a few dozen.
            limits: ProcessLimits {
                memory: raw.max_memory.map(|s| s.0),
                pids: Some(pids.unwrap_or(64)),
                ..ProcessLimits::default()
            },
            sandbox: raw.sandbox,
        }
    }

    fn mcp_command(&mut self, owner: &str, raw: Spanned<Vec<Spanned<String>>>) -> Vec<String> {
        let span = raw.span();
        let command: Vec<String> = raw
            .into_inner()
            .into_iter()
            .map(Spanned::into_inner)
            .collect();
        match command.first() {
            None => self.error(
                span.clone(),
                format!("{owner}: command must name a program, e.g. [\"python3\", \"/opt/mcp/server.py\"]"),
            ),
            Some(program)
                if program.is_empty() || (program.contains('/') && !program.starts_with('/')) =>
            {
                self.error(
                    span.clone(),
                    format!("{owner}: the program must be a bare name or an absolute path"),
                )
            }
            Some(_) => {}
        }
        if command.iter().any(|a| a.contains('\0')) {
            self.error(span, format!("{owner}: command contains a NUL byte"));
        }
        command
    }

    /// A secret's name: a file of the secrets directory, so an id.
    fn secret_name(&mut self, owner: &str, secret: Spanned<String>) -> String {
        if !valid_id(secret.get_ref()) {
            self.error(
                secret.span(),
                format!(
                    "{owner}: secret name `{}` must be {ID_RULE}",
                    secret.get_ref()
                ),
            );
        }
        secret.into_inner()
    }

    fn env_name(&mut self, owner: &str, name: &Spanned<String>) {
        if !valid_env_name(name.get_ref()) {
            self.error(
                name.span(),
                format!(
                    "{owner}: `{}` is not a valid environment variable name",
                    name.get_ref()
                ),
            );
        }
    }

    /// Checks an id's form and uniqueness within its kind.
    fn id(&mut self, kind: &'static str, id: &Spanned<String>) -> String {
        let text = id.get_ref();
        if !valid_id(text) {
            self.error(id.span(), format!("{kind} id `{text}` must be {ID_RULE}"));
        }
        let line = line_column(self.text, id.span().start).0;
        match self.seen.get(&(kind, text.clone())) {
            Some(first) => {
                let first = *first;
                self.error(
                    id.span(),
                    format!("{kind} `{text}` is defined twice (first on line {first})"),
                );
            }
            None => {
                self.seen.insert((kind, text.clone()), line);
            }
        }
        text.clone()
    }
}

fn scripts(raw: RawScripts) -> ScriptLimits {
    let d = ScriptLimits::DEFAULT;
    ScriptLimits {
        max_operations: raw.max_operations.unwrap_or(d.max_operations),
        max_wall_time: raw.max_wall_time.map_or(d.max_wall_time, |v| v.0),
        max_string_size: raw.max_string_size.map_or(d.max_string_size, |v| v.0),
        max_array_len: raw.max_array_len.unwrap_or(d.max_array_len),
        max_map_len: raw.max_map_len.unwrap_or(d.max_map_len),
        max_call_depth: raw.max_call_depth.unwrap_or(d.max_call_depth),
        max_tool_calls: raw.max_tool_calls.unwrap_or(d.max_tool_calls),
        max_output: raw.max_output.map_or(d.max_output, |v| v.0),
        runtime_tools: raw.runtime_tools,
    }
}

const ID_RULE: &str = "1 to 64 characters of a-z, A-Z, 0-9, `_`, `-` and `.`";

/// Whether `id` is a valid id (of a principal, root, grant, tool or
/// secret): 1 to 64 characters of a-z, A-Z, 0-9, `_`, `-` and `.`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// An MCP server's `url`: `http://` and a loopback host (`127.0.0.0/8`,
/// `[::1]`, `localhost`) with a port — the server is on this host, and
/// nothing but loopback is reached (TLS would add nothing there).
fn check_loopback_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("must start with http:// (a server on this host's loopback)")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("must not carry credentials (use bearer_secret)".into());
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(h, _)| h).unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(format!(
            "host `{host}` is not loopback (127.0.0.1, [::1] or localhost)"
        ));
    }
    Ok(())
}

fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    let text = text.trim();
    STANDARD
        .decode(text)
        .or_else(|_| STANDARD_NO_PAD.decode(text))
        .ok()
}

/// `sha256:` followed by 64 hex digits.
pub(crate) fn parse_token_hash(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text.strip_prefix("sha256:")?, &mut out).ok()?;
    Some(out)
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
