//! The Lua scripts, each built once: redis-rs calls them by EVALSHA and reloads on NOSCRIPT
//! (after SCRIPT FLUSH, a restart or a failover the server's script cache is empty).

use std::sync::LazyLock;

use redis::Script;

pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/acquire.lua")));
pub static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/renew.lua")));
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/release.lua")));
pub static COUNT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/count.lua")));
pub static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/leave.lua")));
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/heartbeat.lua")));
