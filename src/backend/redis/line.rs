//! The waiting line's calls: `lua/leave.lua` (a waiter out of the line) and
//! `lua/heartbeat.lua` (this process's waiters kept in it), and the channel of its wake-ups.

use super::scripts::{self, Invocation};
use crate::keys::LineKeys;

/// The line's keys in the order every script takes them: the line, then the liveness of the
/// processes with waiters.
pub fn line_keys(invocation: &mut Invocation, line: &LineKeys) {
    invocation.key(&line.line).key(&line.alive);
}

/// The channel as the scripts take it: on a cluster it is sharded (see the prelude's `wake`).
pub fn wake_channel(line: &LineKeys, cluster: bool) -> String {
    if cluster {
        format!("!{}", line.channel)
    } else {
        line.channel.clone()
    }
}

/// leave.lua's call: a waiter out of the line. Replies with a number.
pub fn leave_invocation(line: &LineKeys, waiter_id: &str, holder: u64) -> Invocation {
    let mut invocation = scripts::LEAVE.prepare_invoke();
    line_keys(&mut invocation, line);
    invocation.arg(waiter_id).arg(holder);
    invocation
}

/// heartbeat.lua's call: one write keeps all of this process's waiters in line; `waiter_ids`
/// (every waiter it has) lets the script take out any it no longer has. Replies with the ids of
/// those whose places went to other users' waiters.
pub fn heartbeat_invocation(line: &LineKeys, waiter_ids: &[String], ttl_ms: u64, holder: u64) -> Invocation {
    let mut invocation = scripts::HEARTBEAT.prepare_invoke();
    line_keys(&mut invocation, line);
    invocation.arg(ttl_ms).arg(holder).arg(waiter_ids);
    invocation
}

#[cfg(test)]
pub mod tests {
    use super::super::layout::read;
    use super::*;

    /// The line of the tag `t`.
    pub fn line() -> LineKeys {
        LineKeys {
            line: "{t}:line".into(),
            alive: "{t}:line:alive".into(),
            tickets: "{t}:line:tickets".into(),
            channel: "{t}:line:wake".into(),
        }
    }

    #[test]
    fn the_line_calls_name_the_line_then_the_liveness() {
        let leave = leave_invocation(&line(), "w1", 7);
        assert_eq!(read::keys(&leave), ["{t}:line", "{t}:line:alive"]);
        assert_eq!(read::args(&leave), ["w1", "7"]);
        let ids = ["w1".to_owned(), "w2".to_owned()];
        let heartbeat = heartbeat_invocation(&line(), &ids, 3000, 7);
        assert_eq!(read::args(&heartbeat), ["3000", "7", "w1", "w2"]);
    }

    #[test]
    fn a_cluster_wakes_on_a_sharded_channel() {
        assert_eq!(wake_channel(&line(), false), "{t}:line:wake");
        assert_eq!(wake_channel(&line(), true), "!{t}:line:wake");
    }
}
