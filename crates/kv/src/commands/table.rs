//! The command table: name, arity (Redis convention: n = exactly n arguments including the
//! name, -n = at least n), kind, and key positions (for COMMAND).

use std::sync::OnceLock;

/// How a command touches the heap (which lock it takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Reads the keyspace: the service lock shared, the committed view.
    Read,
    /// Changes the keyspace: the lock exclusive, one transaction committed before the reply.
    Write,
    /// Touches no data (connection and server commands).
    Admin,
}

/// One command.
#[derive(Debug)]
pub struct Spec {
    /// Lower-case name.
    pub name: &'static str,
    /// Arity, Redis convention.
    pub arity: i32,
    /// Kind.
    pub kind: Kind,
    /// Identity for dispatch.
    pub id: Id,
    /// First key, last key (-1: last argument), step (COMMAND's key specification).
    pub keys: (i32, i32, i32),
}

impl Spec {
    /// Whether `argc` arguments (name included) satisfy the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        if self.arity >= 0 {
            argc == self.arity as usize
        } else {
            argc >= (-self.arity) as usize
        }
    }
}

macro_rules! commands {
    ($($id:ident $name:literal $arity:literal $kind:ident ($f:literal, $l:literal, $s:literal);)*) => {
        /// Command identities.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum Id { $($id),* }

        /// Every command.
        pub static TABLE: &[Spec] = &[
            $(Spec { name: $name, arity: $arity, kind: Kind::$kind, id: Id::$id, keys: ($f, $l, $s) }),*
        ];
    };
}

commands! {
    // Connection and server.
    Ping "ping" -1 Admin (0, 0, 0);
    Echo "echo" 2 Admin (0, 0, 0);
    Select "select" 2 Admin (0, 0, 0);
    Quit "quit" -1 Admin (0, 0, 0);
    Shutdown "shutdown" -1 Admin (0, 0, 0);
    Hello "hello" -1 Admin (0, 0, 0);
    Auth "auth" -2 Admin (0, 0, 0);
    Client "client" -2 Admin (0, 0, 0);
    Command "command" -1 Admin (0, 0, 0);
    Config "config" -2 Admin (0, 0, 0);
    Time "time" 1 Admin (0, 0, 0);
    Save "save" 1 Admin (0, 0, 0);
    Bgsave "bgsave" -1 Admin (0, 0, 0);
    Lastsave "lastsave" 1 Admin (0, 0, 0);
    Wait "wait" 3 Admin (0, 0, 0);
    Migrate "tiermem.migrate" -4 Admin (0, 0, 0);
    Multi "multi" 1 Admin (0, 0, 0);
    Exec "exec" 1 Admin (0, 0, 0);
    Discard "discard" 1 Admin (0, 0, 0);
    Watch "watch" -2 Admin (1, -1, 1);
    Unwatch "unwatch" 1 Admin (0, 0, 0);
    Subscribe "subscribe" -2 Admin (0, 0, 0);
    Unsubscribe "unsubscribe" -1 Admin (0, 0, 0);
    Psubscribe "psubscribe" -2 Admin (0, 0, 0);
    Punsubscribe "punsubscribe" -1 Admin (0, 0, 0);
    Publish "publish" 3 Admin (0, 0, 0);
    Pubsub "pubsub" -2 Admin (0, 0, 0);
    Info "info" -1 Read (0, 0, 0);
    Dbsize "dbsize" 1 Read (0, 0, 0);
    Flushall "flushall" -1 Write (0, 0, 0);
    Flushdb "flushdb" -1 Write (0, 0, 0);
    Swapdb "swapdb" 3 Write (0, 0, 0);
    // Keys.
    Del "del" -2 Write (1, -1, 1);
    Unlink "unlink" -2 Write (1, -1, 1);
    Exists "exists" -2 Read (1, -1, 1);
    Type "type" 2 Read (1, 1, 1);
    Touch "touch" -2 Read (1, -1, 1);
    Randomkey "randomkey" 1 Read (0, 0, 0);
    Rename "rename" 3 Write (1, 2, 1);
    Renamenx "renamenx" 3 Write (1, 2, 1);
    Copy "copy" -3 Write (1, 2, 1);
    Move "move" 3 Write (1, 1, 1);
    Keys "keys" 2 Read (0, 0, 0);
    Scan "scan" -2 Read (0, 0, 0);
    Ttl "ttl" 2 Read (1, 1, 1);
    Pttl "pttl" 2 Read (1, 1, 1);
    Expiretime "expiretime" 2 Read (1, 1, 1);
    Pexpiretime "pexpiretime" 2 Read (1, 1, 1);
    Persist "persist" 2 Write (1, 1, 1);
    Expire "expire" -3 Write (1, 1, 1);
    Pexpire "pexpire" -3 Write (1, 1, 1);
    Expireat "expireat" -3 Write (1, 1, 1);
    Pexpireat "pexpireat" -3 Write (1, 1, 1);
    Object "object" -2 Read (2, 2, 1);
    // Strings.
    Get "get" 2 Read (1, 1, 1);
    Set "set" -3 Write (1, 1, 1);
    Setnx "setnx" 3 Write (1, 1, 1);
    Getset "getset" 3 Write (1, 1, 1);
    Getdel "getdel" 2 Write (1, 1, 1);
    Getex "getex" -2 Write (1, 1, 1);
    Setex "setex" 4 Write (1, 1, 1);
    Psetex "psetex" 4 Write (1, 1, 1);
    Mget "mget" -2 Read (1, -1, 1);
    Mset "mset" -3 Write (1, -1, 2);
    Msetnx "msetnx" -3 Write (1, -1, 2);
    Incr "incr" 2 Write (1, 1, 1);
    Decr "decr" 2 Write (1, 1, 1);
    Incrby "incrby" 3 Write (1, 1, 1);
    Decrby "decrby" 3 Write (1, 1, 1);
    Append "append" 3 Write (1, 1, 1);
    Strlen "strlen" 2 Read (1, 1, 1);
    Getrange "getrange" 4 Read (1, 1, 1);
    Substr "substr" 4 Read (1, 1, 1);
    Setrange "setrange" 4 Write (1, 1, 1);
    Incrbyfloat "incrbyfloat" 3 Write (1, 1, 1);
    Getbit "getbit" 3 Read (1, 1, 1);
    Setbit "setbit" 4 Write (1, 1, 1);
    Bitcount "bitcount" -2 Read (1, 1, 1);
    Bitpos "bitpos" -3 Read (1, 1, 1);
    Bitop "bitop" -4 Write (2, -1, 1);
    Lcs "lcs" -3 Read (1, 2, 1);
    Bitfield "bitfield" -2 Write (1, 1, 1);
    BitfieldRo "bitfield_ro" -2 Read (1, 1, 1);
    // Lists.
    Lpush "lpush" -3 Write (1, 1, 1);
    Rpush "rpush" -3 Write (1, 1, 1);
    Lpushx "lpushx" -3 Write (1, 1, 1);
    Rpushx "rpushx" -3 Write (1, 1, 1);
    Lpop "lpop" -2 Write (1, 1, 1);
    Rpop "rpop" -2 Write (1, 1, 1);
    Lrange "lrange" 4 Read (1, 1, 1);
    Llen "llen" 2 Read (1, 1, 1);
    Lindex "lindex" 3 Read (1, 1, 1);
    Lpos "lpos" -3 Read (1, 1, 1);
    Lmove "lmove" 5 Write (1, 2, 1);
    Rpoplpush "rpoplpush" 3 Write (1, 2, 1);
    Blpop "blpop" -3 Write (1, -2, 1);
    Brpop "brpop" -3 Write (1, -2, 1);
    Brpoplpush "brpoplpush" 4 Write (1, 2, 1);
    Blmove "blmove" 6 Write (1, 2, 1);
    Lmpop "lmpop" -4 Write (0, 0, 0);
    Blmpop "blmpop" -5 Write (0, 0, 0);
    Zmpop "zmpop" -4 Write (0, 0, 0);
    Bzmpop "bzmpop" -5 Write (0, 0, 0);
    Ltrim "ltrim" 4 Write (1, 1, 1);
    Lset "lset" 4 Write (1, 1, 1);
    Linsert "linsert" 5 Write (1, 1, 1);
    Lrem "lrem" 4 Write (1, 1, 1);
    // Sets.
    Sadd "sadd" -3 Write (1, 1, 1);
    Srem "srem" -3 Write (1, 1, 1);
    Smembers "smembers" 2 Read (1, 1, 1);
    Sismember "sismember" 3 Read (1, 1, 1);
    Smismember "smismember" -3 Read (1, 1, 1);
    Scard "scard" 2 Read (1, 1, 1);
    Spop "spop" -2 Write (1, 1, 1);
    Srandmember "srandmember" -2 Read (1, 1, 1);
    Sinter "sinter" -2 Read (1, -1, 1);
    Sunion "sunion" -2 Read (1, -1, 1);
    Sdiff "sdiff" -2 Read (1, -1, 1);
    Sintercard "sintercard" -3 Read (0, 0, 0);
    Sinterstore "sinterstore" -3 Write (1, -1, 1);
    Sunionstore "sunionstore" -3 Write (1, -1, 1);
    Sdiffstore "sdiffstore" -3 Write (1, -1, 1);
    Smove "smove" 4 Write (1, 2, 1);
    // Hashes.
    Hset "hset" -4 Write (1, 1, 1);
    Hmset "hmset" -4 Write (1, 1, 1);
    Hsetnx "hsetnx" 4 Write (1, 1, 1);
    Hget "hget" 3 Read (1, 1, 1);
    Hstrlen "hstrlen" 3 Read (1, 1, 1);
    Hrandfield "hrandfield" -2 Read (1, 1, 1);
    Hincrbyfloat "hincrbyfloat" 4 Write (1, 1, 1);
    Hmget "hmget" -3 Read (1, 1, 1);
    Hgetall "hgetall" 2 Read (1, 1, 1);
    Hkeys "hkeys" 2 Read (1, 1, 1);
    Hvals "hvals" 2 Read (1, 1, 1);
    Hdel "hdel" -3 Write (1, 1, 1);
    Hlen "hlen" 2 Read (1, 1, 1);
    Hexists "hexists" 3 Read (1, 1, 1);
    Hincrby "hincrby" 4 Write (1, 1, 1);
    // Sorted sets.
    Zadd "zadd" -4 Write (1, 1, 1);
    Zincrby "zincrby" 4 Write (1, 1, 1);
    Zrem "zrem" -3 Write (1, 1, 1);
    Zscore "zscore" 3 Read (1, 1, 1);
    Zmscore "zmscore" -3 Read (1, 1, 1);
    Sscan "sscan" -3 Read (1, 1, 1);
    Hscan "hscan" -3 Read (1, 1, 1);
    Zscan "zscan" -3 Read (1, 1, 1);
    Zrandmember "zrandmember" -2 Read (1, 1, 1);
    Zremrangebyscore "zremrangebyscore" 4 Write (1, 1, 1);
    Zremrangebyrank "zremrangebyrank" 4 Write (1, 1, 1);
    Zcard "zcard" 2 Read (1, 1, 1);
    Zcount "zcount" 4 Read (1, 1, 1);
    Zrange "zrange" -4 Read (1, 1, 1);
    Zrevrange "zrevrange" -4 Read (1, 1, 1);
    Zrangebyscore "zrangebyscore" -4 Read (1, 1, 1);
    Zrevrangebyscore "zrevrangebyscore" -4 Read (1, 1, 1);
    Zpopmin "zpopmin" -2 Write (1, 1, 1);
    Zpopmax "zpopmax" -2 Write (1, 1, 1);
    Bzpopmin "bzpopmin" -3 Write (1, -2, 1);
    Zunion "zunion" -3 Read (0, 0, 0);
    Zrank "zrank" 3 Read (1, 1, 1);
    Zrevrank "zrevrank" 3 Read (1, 1, 1);
    Zlexcount "zlexcount" 4 Read (1, 1, 1);
    Zrangebylex "zrangebylex" -4 Read (1, 1, 1);
    Zrevrangebylex "zrevrangebylex" -4 Read (1, 1, 1);
    Zremrangebylex "zremrangebylex" 4 Write (1, 1, 1);
    Zinter "zinter" -3 Read (0, 0, 0);
    Zdiff "zdiff" -3 Read (0, 0, 0);
    Zintercard "zintercard" -3 Read (0, 0, 0);
    Zunionstore "zunionstore" -4 Write (1, 1, 1);
    Zinterstore "zinterstore" -4 Write (1, 1, 1);
    Zdiffstore "zdiffstore" -4 Write (1, 1, 1);
    Zrangestore "zrangestore" -5 Write (1, 2, 1);
    Bzpopmax "bzpopmax" -3 Write (1, -2, 1);
}

/// The command called `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    // FxHash: the names are a fixed, trusted set, and SipHash was 8 % of a pipelined GET's
    // server CPU (perf, redis-benchmark -P 16).
    static MAP: OnceLock<rustc_hash::FxHashMap<&'static [u8], &'static Spec>> = OnceLock::new();
    let map = MAP.get_or_init(|| TABLE.iter().map(|s| (s.name.as_bytes(), s)).collect());
    if name.len() > 24 {
        return None;
    }
    let mut buf = [0u8; 24];
    for (d, s) in buf.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    map.get(&buf[..name.len()]).copied()
}
