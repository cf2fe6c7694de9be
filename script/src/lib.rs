//! The Rhai sandbox every script and tool runs in.
//!
//! An engine starts from `Engine::new_raw()` (nothing registered) plus the
//! pure standard packages: arithmetic, logic, strings, arrays, blobs, maps,
//! math, iterators. The crate is built without modules (`no_module`: no
//! `import`, no resolver), custom syntax or time; `eval` is disabled. Every
//! limit is set: operations, call depth, expression depth, string, array
//! and map sizes, variables, functions; a wall-clock deadline and
//! cancellation are checked from `on_progress`. Nothing in an engine
//! reaches the host except the functions the caller registers.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use portcullis_policy::ScriptLimits;
use rhai::packages::{Package as _, StandardPackage};
use rhai::{Dynamic, Engine, EvalAltResult, ParseErrorType, Position};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use portcullis_wire::frame::{ErrorBody, ErrorCode};

/// Variables a script may define (not in the grant: a program that needs
/// more is not the small program scripts are for).
pub const MAX_VARIABLES: usize = 1_000;
/// Functions a script may define.
pub const MAX_FUNCTIONS: usize = 256;
/// Nesting of expressions (and in functions).
pub const MAX_EXPR_DEPTH: (usize, usize) = (64, 32);
/// How often (in operations) the deadline and cancellation are checked.
const CHECK_EVERY: u64 = 1024;

/// How much the daemon's resident memory may grow while a script runs.
/// Rhai checks a map's or array's size when it is passed or returned, but
/// not when `m[key] = value` adds to it in place, and joining strings is one
/// operation whatever their length: a loop could grow a map by a large
/// string per iteration within `max_operations`. So the resident size is
/// read (one `pread` of /proc/self/statm) at every progress check.
pub const MAX_MEMORY_GROWTH: u64 = 512 << 20;

/// Why a script was stopped (by `on_progress`, or by a host function at a
/// limit): the value it terminates with, which `try` cannot catch.
pub const STOP_MEMORY: &str = "max_memory";
pub const STOP_DEADLINE: &str = "max_wall_time";
pub const STOP_CANCELLED: &str = "cancelled";
pub const STOP_OUTPUT: &str = "max_output";
pub const STOP_TOOL_CALLS: &str = "max_tool_calls";

/// The standard packages, built once and shared by every engine.
fn standard() -> rhai::Shared<rhai::Module> {
    static MODULE: OnceLock<rhai::Shared<rhai::Module>> = OnceLock::new();
    MODULE
        .get_or_init(|| StandardPackage::new().as_shared_module())
        .clone()
}

/// What stops a running script besides its limits, and what it counts.
#[derive(Clone)]
pub struct Watch {
    pub deadline: Instant,
    pub cancel: CancellationToken,
    /// Set by a callback (the output cap) to stop the script.
    pub stopped: Arc<OnceLock<&'static str>>,
    /// Operations run so far (the last `on_progress` count).
    pub operations: Arc<AtomicU64>,
}

impl Watch {
    pub fn new(deadline: Instant, cancel: CancellationToken) -> Self {
        Self {
            deadline,
            cancel,
            stopped: Arc::default(),
            operations: Arc::default(),
        }
    }
}

/// A sandboxed engine with `limits`, stopped as `watch` says.
pub fn sandboxed(limits: &ScriptLimits, watch: &Watch) -> Engine {
    let mut engine = Engine::new_raw();
    engine.register_global_module(standard());
    engine
        .set_max_operations(limits.max_operations.max(1))
        .set_max_call_levels(usize_of(limits.max_call_depth))
        .set_max_expr_depths(MAX_EXPR_DEPTH.0, MAX_EXPR_DEPTH.1)
        .set_max_string_size(usize_of(limits.max_string_size).max(1))
        .set_max_array_size(usize_of(limits.max_array_len).max(1))
        .set_max_map_size(usize_of(limits.max_map_len).max(1))
        .set_max_variables(MAX_VARIABLES)
        .set_max_functions(MAX_FUNCTIONS)
        .set_max_strings_interned(256)
        .set_fail_on_invalid_map_property(false);
    engine.disable_symbol("eval");
    let Watch {
        deadline,
        cancel,
        stopped,
        operations,
    } = watch.clone();
    let memory_limit = resident_bytes().map(|now| now + MAX_MEMORY_GROWTH);
    engine.on_progress(move |ops| {
        operations.store(ops, Ordering::Relaxed);
        if ops % CHECK_EVERY != 0 {
            return None;
        }
        if let Some(why) = stopped.get() {
            return Some(Dynamic::from(*why));
        }
        if cancel.is_cancelled() {
            return Some(Dynamic::from(STOP_CANCELLED));
        }
        if let (Some(limit), Some(now)) = (memory_limit, resident_bytes())
            && now > limit
        {
            return Some(Dynamic::from(STOP_MEMORY));
        }
        (Instant::now() >= deadline).then(|| Dynamic::from(STOP_DEADLINE))
    });
    // Until the caller routes them: print and debug go nowhere.
    engine.on_print(|_| {}).on_debug(|_, _, _| {});
    engine
}

/// Runs `source` in a sandboxed engine with nothing registered beyond the
/// standard packages (the unit tests' and the `script` fuzz target's way
/// in). Returns the value and the operations it took.
pub fn run_pure(source: &str, limits: &ScriptLimits) -> Result<(Value, u64), ErrorBody> {
    let watch = Watch::new(
        Instant::now() + limits.max_wall_time,
        CancellationToken::new(),
    );
    let engine = sandboxed(limits, &watch);
    let ast = engine
        .compile(source)
        .map_err(|e| error_body(&e.into(), limits))?;
    let value = engine
        .eval_ast::<Dynamic>(&ast)
        .map_err(|e| error_body(&e, limits))?;
    Ok((
        result_json(&value, limits)?,
        watch.operations.load(Ordering::Relaxed),
    ))
}

/// The daemon's resident set size, from /proc/self/statm (kept open).
pub fn resident_bytes() -> Option<u64> {
    use std::os::unix::fs::FileExt as _;
    static STATM: OnceLock<Option<std::fs::File>> = OnceLock::new();
    let file = STATM
        .get_or_init(|| std::fs::File::open("/proc/self/statm").ok())
        .as_ref()?;
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// JSON to a script value.
pub fn to_dynamic(value: &Value) -> Result<Dynamic, ErrorBody> {
    rhai::serde::to_dynamic(value).map_err(|e| {
        ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("arguments cannot be given to a script: {e}"),
        )
    })
}

/// A script value to JSON (functions and other non-data values are an
/// error).
pub fn to_json(value: &Dynamic) -> Result<Value, ErrorBody> {
    rhai::serde::from_dynamic::<Value>(value).map_err(|e| {
        ErrorBody::new(
            ErrorCode::ProviderError,
            format!("the script's value is not JSON data: {e}"),
        )
    })
}

/// Levels of arrays and maps a script's value may nest: the frame around
/// it takes a few more, and a frame nests at most 64 (docs/PROTOCOL.md §4).
const VALUE_DEPTH: u64 = 56;

/// A script's value as JSON, checked against the size limits once more:
/// Rhai does not check a map or array grown in place (`m[k] = v`) until it
/// is passed on, and a returned value is not passed on.
pub fn result_json(value: &Dynamic, limits: &ScriptLimits) -> Result<Value, ErrorBody> {
    fn check(value: &Value, limits: &ScriptLimits, depth: u64) -> Result<(), (&'static str, u64)> {
        if depth > VALUE_DEPTH {
            return Err(("nesting", VALUE_DEPTH));
        }
        let depth = depth + 1;
        match value {
            Value::String(s) if s.len() as u64 > limits.max_string_size => {
                Err(("max_string_size", limits.max_string_size))
            }
            Value::Array(items) => {
                if items.len() as u64 > limits.max_array_len {
                    return Err(("max_array_len", limits.max_array_len));
                }
                items.iter().try_for_each(|v| check(v, limits, depth))
            }
            Value::Object(map) => {
                if map.len() as u64 > limits.max_map_len {
                    return Err(("max_map_len", limits.max_map_len));
                }
                map.values().try_for_each(|v| check(v, limits, depth))
            }
            _ => Ok(()),
        }
    }
    let json = to_json(value)?;
    check(&json, limits, 0).map_err(|(name, value)| {
        ErrorBody::new(
            ErrorCode::ProviderError,
            format!("the script hit its limit {name} ({value}): its value is too large"),
        )
        .with_details(json!({"limit": name, "value": value}))
    })?;
    Ok(json)
}

/// A thrown error a script can catch, carrying a relay error (what
/// `call_tool` throws when the call is refused or fails).
pub fn throw(error: &ErrorBody) -> Box<EvalAltResult> {
    let mut map = rhai::Map::new();
    map.insert(
        "code".into(),
        Dynamic::from(error.code.as_str().to_string()),
    );
    map.insert("message".into(), Dynamic::from(error.message.clone()));
    if let Some(details) = error.details.as_ref().and_then(|d| to_dynamic(d).ok()) {
        map.insert("details".into(), details);
    }
    EvalAltResult::ErrorRuntime(Dynamic::from_map(map), Position::NONE).into()
}

/// What a failed script answers: a limit names itself, a relay error
/// thrown by `call_tool` (and not caught) keeps its code, anything else
/// is the script's own error.
/// The answer of a script stopped at its `max_wall_time`.
pub fn deadline_error(limits: &ScriptLimits) -> ErrorBody {
    let ms = limits.max_wall_time.as_millis();
    ErrorBody::new(
        ErrorCode::Timeout,
        format!("the script hit its limit max_wall_time ({ms} ms)"),
    )
    .with_details(json!({"limit": "max_wall_time", "value": ms as u64}))
}

pub fn error_body(error: &EvalAltResult, limits: &ScriptLimits) -> ErrorBody {
    use EvalAltResult as E;
    let limit = |name: &str, value: u64, what: &str| {
        ErrorBody::new(
            ErrorCode::ProviderError,
            format!("the script hit its limit {name} ({value}): {what}"),
        )
        .with_details(json!({"limit": name, "value": value}))
    };
    match error {
        E::ErrorInFunctionCall(_, _, inner, _) => error_body(inner, limits),
        E::ErrorTooManyOperations(_) => limit(
            "max_operations",
            limits.max_operations,
            "too many operations",
        ),
        E::ErrorStackOverflow(_) => limit(
            "max_call_depth",
            limits.max_call_depth,
            "functions call too deep",
        ),
        E::ErrorTooManyVariables(_) => {
            limit("max_variables", MAX_VARIABLES as u64, "too many variables")
        }
        E::ErrorDataTooLarge(what, _) => match what.as_str() {
            w if w.contains("string") => limit(
                "max_string_size",
                limits.max_string_size,
                "a string grew too large",
            ),
            w if w.contains("map") => {
                limit("max_map_len", limits.max_map_len, "a map grew too large")
            }
            _ => limit(
                "max_array_len",
                limits.max_array_len,
                "an array grew too large",
            ),
        },
        E::ErrorTerminated(why, _) => match why.clone().into_string().as_deref() {
            Ok(STOP_DEADLINE) => deadline_error(limits),
            Ok(STOP_MEMORY) => limit(
                "max_memory",
                MAX_MEMORY_GROWTH,
                "the gateway's memory grew too much while it ran",
            ),
            Ok(STOP_OUTPUT) => limit(
                "max_output",
                limits.max_output,
                "print and debug wrote too much",
            ),
            Ok(STOP_TOOL_CALLS) => limit(
                "max_tool_calls",
                limits.max_tool_calls,
                "one call_tool too many",
            ),
            _ => ErrorBody::new(ErrorCode::Cancelled, "the script was cancelled"),
        },
        E::ErrorParsing(ParseErrorType::ExprTooDeep, pos) => limit(
            "max_expr_depth",
            MAX_EXPR_DEPTH.0 as u64,
            &format!("expressions nest too deep ({pos})"),
        ),
        E::ErrorParsing(ParseErrorType::TooManyFunctions, _) => {
            limit("max_functions", MAX_FUNCTIONS as u64, "too many functions")
        }
        E::ErrorParsing(e, pos) => ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("the script does not compile: {e} ({pos})"),
        ),
        E::ErrorRuntime(value, pos) => {
            if let Some(map) = value.read_lock::<rhai::Map>() {
                let code = map
                    .get("code")
                    .and_then(|c| c.clone().into_string().ok())
                    .and_then(|c| serde_json::from_value(Value::String(c)).ok())
                    // A code the protocol does not have is not sent as one.
                    .filter(|c| *c != ErrorCode::Unrecognized);
                let message = map.get("message").map(|m| m.to_string());
                if let (Some(code), Some(message)) = (code, message) {
                    let details = map.get("details").and_then(|d| to_json(d).ok());
                    return match details {
                        Some(details) => ErrorBody::new(code, message).with_details(details),
                        None => ErrorBody::new(code, message),
                    };
                }
            }
            ErrorBody::new(
                ErrorCode::ProviderError,
                format!("the script threw: {value} ({pos})"),
            )
        }
        other => ErrorBody::new(ErrorCode::ProviderError, format!("script error: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn run(source: &str, limits: ScriptLimits) -> Result<Value, ErrorBody> {
        run_pure(source, &limits).map(|(value, _)| value)
    }

    #[test]
    fn a_value_nested_deeper_than_a_frame_may_is_refused() {
        let deep = |levels: usize| format!("let v = 1; for i in 0..{levels} {{ v = [v]; }} v");
        assert!(run(&deep(50), ScriptLimits::DEFAULT).is_ok());
        let e = run(&deep(200), ScriptLimits::DEFAULT).unwrap_err();
        assert_eq!(e.code, ErrorCode::ProviderError);
        assert!(e.message.contains("nesting (56)"), "{}", e.message);
    }

    #[test]
    fn a_thrown_code_the_protocol_lacks_is_not_sent_as_a_code() {
        let e = run(r#"throw #{code: "x", message: "m"}"#, ScriptLimits::DEFAULT).unwrap_err();
        assert_eq!(e.code, ErrorCode::ProviderError);
        let e = run(
            r#"throw #{code: "not_found", message: "m"}"#,
            ScriptLimits::DEFAULT,
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "m"));
    }

    fn limit_of(result: Result<Value, ErrorBody>) -> String {
        let error = result.expect_err("the limit must stop the script");
        error
            .details
            .and_then(|d| d["limit"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("no limit in {:?}", error.message))
    }

    #[test]
    fn a_script_computes_with_the_standard_packages() {
        let value = run(
            r#"let m = #{a: [1, 2, 3]}; m.a.map(|x| x * 2).reduce(|s, x| s + x, 0) + "abc".len"#,
            ScriptLimits::DEFAULT,
        )
        .unwrap();
        assert_eq!(value, json!(15));
    }

    #[test]
    fn every_limit_stops_its_script_and_names_itself() {
        let small = ScriptLimits {
            max_operations: 100_000,
            max_wall_time: Duration::from_secs(10),
            max_string_size: 1000,
            max_array_len: 1000,
            max_map_len: 100,
            max_call_depth: 16,
            ..ScriptLimits::DEFAULT
        };
        let many_variables: String = (0..=MAX_VARIABLES)
            .map(|i| format!("let v{i} = 1;"))
            .collect();
        let cases = [
            ("loop {}", "max_operations"),
            ("fn f(n) { f(n + 1) } f(0)", "max_call_depth"),
            (r#"let s = "x"; loop { s += s; }"#, "max_string_size"),
            ("let a = []; loop { a.push(1); }", "max_array_len"),
            (
                "let m = #{}; let i = 0; loop { m[`k${i}`] = i; i += 1; m.len() }",
                "max_map_len",
            ),
            (&many_variables, "max_variables"),
            (
                &format!("{}1{}", "(".repeat(200), ")".repeat(200)),
                "max_expr_depth",
            ),
        ];
        for (source, limit) in cases {
            let label: String = source.chars().take(40).collect();
            assert_eq!(limit_of(run(source, small)), limit, "{label}");
        }
        // A map grown in place by a new 1 MiB string per iteration: Rhai
        // does not check the map there, the memory meter stops it.
        let big = ScriptLimits {
            max_string_size: 1 << 20,
            ..ScriptLimits::DEFAULT
        };
        let bomb = r#"let s = "x"; while s.len() < 500000 { s += s; } let m = #{}; let i = 0; loop { m[`${i}`] = s + i; i += 1; }"#;
        assert_eq!(limit_of(run(bomb, big)), "max_memory");
        let slow = ScriptLimits {
            max_wall_time: Duration::from_millis(50),
            ..ScriptLimits::DEFAULT
        };
        let started = Instant::now();
        assert_eq!(limit_of(run("loop {}", slow)), "max_wall_time");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_value_grown_in_place_is_checked_when_returned() {
        let limits = ScriptLimits {
            max_map_len: 10,
            ..ScriptLimits::DEFAULT
        };
        let source = "let m = #{}; for i in 0..20 { m[`k${i}`] = i; } m";
        assert_eq!(limit_of(run(source, limits)), "max_map_len");
    }

    #[test]
    fn eval_and_import_do_not_exist() {
        for source in [r#"eval("1 + 1")"#, r#"import "x" as y; 1"#] {
            let error = run(source, ScriptLimits::DEFAULT).expect_err(source);
            assert!(
                matches!(
                    error.code,
                    ErrorCode::InvalidRequest | ErrorCode::ProviderError
                ),
                "{source}: {error:?}"
            );
        }
    }
}
