//! The Lua scripts (`src/lua/`) as the server runs them, and how they are called: as the
//! functions of one library (FCALL; Redis 7 and Valkey), whose code, the prelude's 40-odd
//! helpers included, is loaded once per server instead of being rebuilt on every call (that
//! rebuild was about half of a script call's time), or, where the server has no functions
//! (Redis 6) or the user may not load them, each as a script of its own (EVALSHA). Either is
//! reloaded when the server lost it (FUNCTION FLUSH or SCRIPT FLUSH, a restart, a failover);
//! see `connection.rs`.
//!
//! Lua in Redis has no modules: a script's code is its parts concatenated, here and nowhere
//! else. First the prelude's parts (`lua/prelude/`, in `PRELUDE_PARTS`' order), then the
//! script's own (`SOURCES`: a script with helpers of its own keeps them in a folder of its name,
//! `lua/acquire/`, in front of its file). The tests and benchmarks that call a script alone get
//! its code from here too, through the binding (`_core._script_source`).

use std::sync::LazyLock;

use redis::{Script, ToRedisArgs};

/// The prelude's parts, in order: each uses what the parts before it define.
const PRELUDE_PARTS: [&str; 7] = [
    include_str!("../../lua/prelude/calls.lua"),
    include_str!("../../lua/prelude/batches.lua"),
    include_str!("../../lua/prelude/clock.lua"),
    include_str!("../../lua/prelude/holders.lua"),
    include_str!("../../lua/prelude/reaping.lua"),
    include_str!("../../lua/prelude/lines.lua"),
    include_str!("../../lua/prelude/rates.lua"),
];

/// The prelude, in front of every script.
static PRELUDE: LazyLock<String> = LazyLock::new(|| PRELUDE_PARTS.concat());

/// A script: its function's name in the library, and the same code as a script of its own.
pub struct LuaScript {
    pub function: String,
    pub script: Script,
}

/// The function library of every script: its name carries a hash of its code, so that
/// processes running two versions of this package side by side (a rolling deploy) each call
/// their own.
pub struct Library {
    pub code: String,
}

/// Every script by name, with its parts in order: its helpers, then the script's file.
const SOURCES: [(&str, &[&str]); 17] = [
    (
        "acquire",
        &[
            include_str!("../../lua/acquire/requests.lua"),
            include_str!("../../lua/acquire/line.lua"),
            include_str!("../../lua/acquire.lua"),
        ],
    ),
    ("keepalive", &[include_str!("../../lua/keepalive.lua")]),
    ("reclaim", &[include_str!("../../lua/reclaim.lua")]),
    ("count", &[include_str!("../../lua/count.lua")]),
    ("release", &[include_str!("../../lua/release.lua")]),
    ("leave", &[include_str!("../../lua/leave.lua")]),
    ("heartbeat", &[include_str!("../../lua/heartbeat.lua")]),
    ("strays", &[include_str!("../../lua/strays.lua")]),
    ("prune", &[include_str!("../../lua/prune.lua")]),
    ("hit", &[include_str!("../../lua/hit.lua")]),
    ("forget", &[include_str!("../../lua/forget.lua")]),
    ("topup", &[include_str!("../../lua/topup.lua")]),
    ("settle", &[include_str!("../../lua/settle.lua")]),
    ("revoke", &[include_str!("../../lua/revoke.lua")]),
    ("revoked", &[include_str!("../../lua/revoked.lua")]),
    ("depart", &[include_str!("../../lua/depart.lua")]),
    ("answers", &[include_str!("../../lua/answers.lua")]),
];

/// The names of the scripts, as `script_source` knows them.
pub fn script_names() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(name, _)| *name)
}

/// The code of the script `name` as a script of its own: the prelude, the start of a call
/// (`begin_call`, prelude/calls.lua), the script's parts. None for a name not in `SOURCES`.
pub fn script_source(name: &str) -> Option<String> {
    let (_, parts) = SOURCES.iter().find(|(script, _)| *script == name)?;
    Some(format!("{}begin_call()\n{}", *PRELUDE, parts.concat()))
}

/// The library's name: `fastapi_stream_lease_` and the first 12 hex digits of the SHA-1 of
/// the scripts' code.
static LIBRARY_NAME: LazyLock<String> = LazyLock::new(|| {
    let all: String = SOURCES
        .iter()
        .flat_map(|(_, parts)| parts.iter().copied())
        .collect();
    let hash = Script::new(&format!("{}{all}", *PRELUDE)).get_hash().to_owned();
    format!("fastapi_stream_lease_{}", &hash[..12])
});

/// The line of a script that ends its definitions (helpers that keep nothing from one call to
/// the next): the library defines them once, at load; what follows the line runs on every
/// call. As a script of its own, the file runs from the top, as it reads.
const PER_CALL: &str = "\n--[[ per call ]]\n";

/// The library: the prelude once, then each script in a block of its own: its definitions, and
/// a function whose arguments are named as a script's globals (KEYS, ARGV) that starts from the
/// prelude's per-call state and runs the rest.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let name = &*LIBRARY_NAME;
    let mut code = format!("#!lua name={name}\n{}\n", *PRELUDE);
    for (script, parts) in SOURCES {
        let body = parts.concat();
        let (definitions, call) = body.split_once(PER_CALL).unwrap_or(("", &body));
        code.push_str(&format!(
            "do\n{definitions}\nredis.register_function('{name}_{script}', function(KEYS, ARGV)\n\
             begin_call()\n{call}\nend)\nend\n"
        ));
    }
    Library { code }
});

fn script(name: &str) -> LuaScript {
    LuaScript {
        function: format!("{}_{name}", *LIBRARY_NAME),
        script: Script::new(&script_source(name).expect("a script of SOURCES")),
    }
}

macro_rules! scripts {
    ($($name:ident = $file:literal;)*) => {
        $(pub static $name: LazyLock<LuaScript> = LazyLock::new(|| script($file));)*

        /// Builds the library and every script now, on the thread that opens a store. One
        /// built lazily on a core's thread while the process forks stays "being built" in the
        /// child, whose first call of it then waits forever (a pre-forking server forks while
        /// the parent's first lease looks for missed revokes, say).
        pub fn prepare_all() {
            LazyLock::force(&LIBRARY);
            $(LazyLock::force(&$name);)*
        }
    };
}

scripts! {
    ACQUIRE = "acquire";
    KEEPALIVE = "keepalive";
    RECLAIM = "reclaim";
    COUNT = "count";
    RELEASE = "release";
    LEAVE = "leave";
    HEARTBEAT = "heartbeat";
    STRAYS = "strays";
    PRUNE = "prune";
    HIT = "hit";
    FORGET = "forget";
    TOP_UP = "topup";
    SETTLE = "settle";
    REVOKE = "revoke";
    REVOKED = "revoked";
    DEPART = "depart";
    ANSWERS = "answers";
}

impl LuaScript {
    pub fn prepare_invoke(&'static self) -> Invocation {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a script: its keys and arguments, sent as FCALL or EVALSHA.
pub struct Invocation {
    pub script: &'static LuaScript,
    pub keys: Vec<Vec<u8>>,
    pub args: Vec<Vec<u8>>,
}

impl Invocation {
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// The call as FCALL of the script's function in the library.
    pub fn fcall(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.script.function)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// The call as a script of its own (EVALSHA, and SCRIPT LOAD on NOSCRIPT).
    pub fn script(&self) -> redis::ScriptInvocation<'static> {
        let mut invocation = self.script.script.prepare_invoke();
        invocation.key(&self.keys).arg(&self.args);
        invocation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_names_every_script_and_its_version() {
        let library = &LIBRARY.code;
        assert!(library.starts_with(&format!("#!lua name={}\n", *LIBRARY_NAME)));
        for (name, _) in SOURCES {
            assert!(library.contains(&format!("'{}_{name}'", *LIBRARY_NAME)), "{name}");
        }
        assert_eq!(ACQUIRE.function, format!("{}_acquire", *LIBRARY_NAME));
    }

    #[test]
    fn acquire_defines_its_helpers_once_per_library() {
        let acquire = SOURCES[0].1.concat();
        let (definitions, call) = acquire.split_once(PER_CALL).expect("acquire.lua's line");
        assert!(definitions.contains("local function decide()"));
        assert!(definitions.contains("local function enter_line(lined)"));
        assert!(!call.contains("local function"));
        assert!(LIBRARY
            .code
            .contains(&format!("{definitions}\nredis.register_function(")));
    }

    #[test]
    fn every_part_ends_its_last_line() {
        // Parts are concatenated: a last line without its newline would run into the next
        // part's first line.
        let scripts = SOURCES.iter().flat_map(|(_, parts)| parts.iter());
        for part in PRELUDE_PARTS.iter().chain(scripts) {
            assert!(part.ends_with('\n'), "{:?}", part.lines().next());
        }
    }

    #[test]
    fn a_script_alone_is_the_prelude_the_start_of_a_call_and_its_parts() {
        let release = script_source("release").expect("a script");
        assert!(release.starts_with(PRELUDE_PARTS[0]));
        assert!(release.ends_with(&format!("\nbegin_call()\n{}", SOURCES[4].1[0])));
        assert_eq!(script_source("prelude"), None);
        assert_eq!(script_names().count(), SOURCES.len());
    }
}
