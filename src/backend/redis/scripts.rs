//! The Lua scripts, each built once with the prelude in front (`lua/prelude.lua`): redis-rs
//! calls them by EVALSHA and reloads on NOSCRIPT (after SCRIPT FLUSH, a restart or a failover
//! the server's script cache is empty).

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/prelude.lua"),
                include_str!(concat!("../../lua/", $file))
            ))
        })
    };
}

pub static ACQUIRE: LazyLock<Script> = script!("acquire.lua");
pub static KEEPALIVE: LazyLock<Script> = script!("keepalive.lua");
pub static RECLAIM: LazyLock<Script> = script!("reclaim.lua");
pub static COUNT: LazyLock<Script> = script!("count.lua");
pub static RELEASE: LazyLock<Script> = script!("release.lua");
pub static LEAVE: LazyLock<Script> = script!("leave.lua");
pub static HEARTBEAT: LazyLock<Script> = script!("heartbeat.lua");
pub static STRAYS: LazyLock<Script> = script!("strays.lua");
pub static PRUNE: LazyLock<Script> = script!("prune.lua");
pub static HIT: LazyLock<Script> = script!("hit.lua");
pub static FORGET: LazyLock<Script> = script!("forget.lua");
pub static TOP_UP: LazyLock<Script> = script!("topup.lua");
pub static SETTLE: LazyLock<Script> = script!("settle.lua");
pub static REVOKE: LazyLock<Script> = script!("revoke.lua");
pub static REVOKED: LazyLock<Script> = script!("revoked.lua");
