//! The Lua scripts, each built once: redis-rs calls them by EVALSHA and reloads on NOSCRIPT
//! (after SCRIPT FLUSH, a restart or a failover the server's script cache is empty). Scripts
//! that count or keep leases start with the holders prelude (`lua/holders.lua`).

use std::sync::LazyLock;

use redis::Script;

/// A script with the holders prelude in front.
macro_rules! with_holders {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/holders.lua"),
                include_str!(concat!("../../", $file))
            ))
        })
    };
}

pub static ACQUIRE: LazyLock<Script> = with_holders!("lua/acquire.lua");
pub static KEEPALIVE: LazyLock<Script> = with_holders!("lua/keepalive.lua");
pub static RECLAIM: LazyLock<Script> = with_holders!("lua/reclaim.lua");
pub static COUNT: LazyLock<Script> = with_holders!("lua/count.lua");
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/release.lua")));
pub static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/leave.lua")));
pub static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/heartbeat.lua")));
