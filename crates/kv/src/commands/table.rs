//! The command table, as Redis's own: each command's name, arity (Redis convention: n =
//! exactly n arguments including the name, -n = at least n), key positions (for COMMAND and for
//! the keys a write touches), flags, and handler — the function in a command-group file
//! (`keys`, `strings`, `bitmaps`, `lists`, `sets`, `hashes`, `zsets`, `pops`) that executes
//! it. Connection and server commands are answered by the service itself (`admin`, and the
//! transaction and pub/sub code of `commands`).

use super::data::{self, Counters, HResult};
use super::{bitmaps, dump, hashes, keys, lists, migrate, pops, sets, sort, strings, zsets};
use crate::ds::{Mem, Store, View, Wtx};
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

/// A reader over memory `M`: `(counters, database, memory, arguments, reply)`.
pub(super) type ReadFn<M> = fn(&mut Counters, &Store, &M, &[&[u8]], &mut Vec<u8>);

/// A writer: `(database, transaction, arguments, reply)`; `Err` only for a heap error.
pub(super) type WriteFn = fn(&Store, &mut Wtx<'_>, &[&[u8]], &mut Vec<u8>) -> HResult;

/// A reader on the committed view.
pub(super) type ViewReadFn = fn(&mut Counters, &Store, &View<'_>, &[&[u8]], &mut Vec<u8>);

/// A reader on a write transaction.
pub(super) type WtxReadFn = fn(&mut Counters, &Store, &Wtx<'_>, &[&[u8]], &mut Vec<u8>);

/// A reader's two instantiations: on the committed view (a read under the shared lock), and on
/// the open transaction (a read inside a group commit or an EXEC, which sees its writes).
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadFns {
    /// On the committed view.
    pub(super) view: ViewReadFn,
    /// On a write transaction.
    pub(super) wtx: WtxReadFn,
}

/// The memory a reader runs on: picks the reader's instantiation for it (no dynamic dispatch
/// on the memory; one indirect call per command).
pub(super) trait ReadMem: Mem + Sized {
    /// `f`'s instantiation for `Self`.
    fn reader(f: &ReadFns) -> ReadFn<Self>;
}

impl ReadMem for View<'_> {
    #[inline]
    fn reader(f: &ReadFns) -> ReadFn<Self> {
        f.view
    }
}

impl ReadMem for Wtx<'_> {
    #[inline]
    fn reader(f: &ReadFns) -> ReadFn<Self> {
        f.wtx
    }
}

/// What executes a command.
#[derive(Clone, Copy, Debug)]
pub(super) enum Handler {
    /// A reader of the keyspace ([`Kind::Read`]).
    Read(ReadFns),
    /// A writer ([`Kind::Write`]).
    Write(WriteFn),
    /// Answered by the service itself: connection and server commands ([`Kind::Admin`]), and
    /// INFO ([`Kind::Read`]: it reads the keyspace, but reports on the service too).
    Service(Kind),
}

/// Redis command flags the server acts on, besides `write` and `readonly` (which the handler
/// says: [`Spec::kind`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(u8);

impl Flags {
    /// None.
    pub const NONE: Flags = Flags(0);
    /// `blocking`: may block the client until a key it waits on gets something
    /// (`super::blocking`).
    pub const BLOCKING: Flags = Flags(1);
    /// `no-multi`: may not be queued inside MULTI (`super::multi::allowed_in_multi`).
    pub const NO_MULTI: Flags = Flags(2);
    /// Redis's `LOOKUP_NOTOUCH` lookups: the command does not count as a use of its keys
    /// (`super::access`: OBJECT IDLETIME).
    pub const NO_TOUCH: Flags = Flags(4);

    /// These flags and `f`.
    pub const fn with(self, f: Flags) -> Flags {
        Flags(self.0 | f.0)
    }

    /// Whether every flag of `f` is set.
    pub const fn contains(self, f: Flags) -> bool {
        self.0 & f.0 == f.0
    }
}

/// One command.
#[derive(Debug)]
pub struct Spec {
    /// Lower-case name.
    pub name: &'static str,
    /// Arity, Redis convention.
    pub arity: i32,
    /// Identity.
    pub id: Id,
    /// First key, last key (-1: last argument), step (COMMAND's key specification).
    pub keys: (i32, i32, i32),
    /// Flags beyond `write` / `readonly`.
    pub flags: Flags,
    /// What executes it.
    pub(super) handler: Handler,
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

    /// How it touches the heap, from its handler.
    #[inline]
    pub fn kind(&self) -> Kind {
        match self.handler {
            Handler::Read(_) => Kind::Read,
            Handler::Write(_) => Kind::Write,
            Handler::Service(k) => k,
        }
    }

    /// The flags COMMAND and COMMAND INFO report: `write` or `readonly`, by its kind.
    pub fn info_flags(&self) -> &'static [&'static str] {
        match self.kind() {
            Kind::Write => &["write"],
            Kind::Read => &["readonly"],
            Kind::Admin => &[],
        }
    }
}

/// The table entry of command `id`.
#[inline]
pub fn spec(id: Id) -> &'static Spec {
    &TABLE[id as usize]
}

/// A [`Handler`] from its table notation: `admin`, `service_read`, `read(f)`, `write(f)`, or
/// `read(f; id)` / `write(f; id)` for a function shared by several commands, which it tells
/// apart by the [`Id`] passed first. Readers get their two instantiations ([`ReadFns`]).
macro_rules! handler {
    ($id:ident admin) => {
        Handler::Service(Kind::Admin)
    };
    ($id:ident service_read) => {
        Handler::Service(Kind::Read)
    };
    ($id:ident read($f:path; id)) => {
        Handler::Read(ReadFns {
            view: |cx, st, m, a, out| $f(cx, st, m, Id::$id, a, out),
            wtx: |cx, st, m, a, out| $f(cx, st, m, Id::$id, a, out),
        })
    };
    ($id:ident read($f:path)) => {
        Handler::Read(ReadFns {
            view: |cx, st, m, a, out| $f(cx, st, m, a, out),
            wtx: |cx, st, m, a, out| $f(cx, st, m, a, out),
        })
    };
    ($id:ident write($f:path; id)) => {
        Handler::Write(|st, w, a, out| $f(st, w, Id::$id, a, out))
    };
    ($id:ident write($f:path)) => {
        Handler::Write($f)
    };
}

/// `Id` and `TABLE` (in the same order: `TABLE[id as usize]` is `id`'s entry) from one line per
/// command: `Id "name" arity (first, last, step) handler [FLAGS];`.
macro_rules! commands {
    ($(
        $id:ident $name:literal $arity:literal ($f:literal, $l:literal, $s:literal)
        $kind:ident $(($($h:tt)*))? $([$($flag:ident)*])?;
    )*) => {
        /// Command identities.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(missing_docs)]
        pub enum Id { $($id),* }

        /// Every command.
        pub static TABLE: &[Spec] = &[
            $(Spec {
                name: $name,
                arity: $arity,
                id: Id::$id,
                keys: ($f, $l, $s),
                flags: Flags::NONE $($(.with(Flags::$flag))*)?,
                handler: handler!($id $kind $(($($h)*))?),
            }),*
        ];
    };
}

commands! {
    // Connection and server.
    Ping "ping" -1 (0, 0, 0) admin;
    Echo "echo" 2 (0, 0, 0) admin;
    Select "select" 2 (0, 0, 0) admin;
    Quit "quit" -1 (0, 0, 0) admin;
    Shutdown "shutdown" -1 (0, 0, 0) admin [NO_MULTI];
    Hello "hello" -1 (0, 0, 0) admin;
    Auth "auth" -2 (0, 0, 0) admin;
    Client "client" -2 (0, 0, 0) admin;
    Command "command" -1 (0, 0, 0) admin;
    Config "config" -2 (0, 0, 0) admin;
    Time "time" 1 (0, 0, 0) admin;
    Save "save" 1 (0, 0, 0) admin [NO_MULTI];
    Bgsave "bgsave" -1 (0, 0, 0) admin [NO_MULTI];
    Lastsave "lastsave" 1 (0, 0, 0) admin;
    Wait "wait" 3 (0, 0, 0) admin;
    Migrate "tiermem.migrate" -4 (0, 0, 0) admin [NO_MULTI];
    Multi "multi" 1 (0, 0, 0) admin;
    Exec "exec" 1 (0, 0, 0) admin;
    Discard "discard" 1 (0, 0, 0) admin;
    Watch "watch" -2 (1, -1, 1) admin;
    Unwatch "unwatch" 1 (0, 0, 0) admin;
    Subscribe "subscribe" -2 (0, 0, 0) admin;
    Unsubscribe "unsubscribe" -1 (0, 0, 0) admin;
    Psubscribe "psubscribe" -2 (0, 0, 0) admin;
    Punsubscribe "punsubscribe" -1 (0, 0, 0) admin;
    Publish "publish" 3 (0, 0, 0) admin;
    Pubsub "pubsub" -2 (0, 0, 0) admin;
    Info "info" -1 (0, 0, 0) service_read;
    Dbsize "dbsize" 1 (0, 0, 0) read(keys::dbsize);
    Flushall "flushall" -1 (0, 0, 0) write(keys::flush; id);
    Flushdb "flushdb" -1 (0, 0, 0) write(keys::flush; id);
    Swapdb "swapdb" 3 (0, 0, 0) write(keys::swapdb);
    // Keys.
    Del "del" -2 (1, -1, 1) write(keys::del);
    Unlink "unlink" -2 (1, -1, 1) write(keys::del);
    Exists "exists" -2 (1, -1, 1) read(keys::exists) [NO_TOUCH];
    Type "type" 2 (1, 1, 1) read(keys::key_type) [NO_TOUCH];
    Touch "touch" -2 (1, -1, 1) read(keys::touch);
    Randomkey "randomkey" 1 (0, 0, 0) read(keys::randomkey);
    Rename "rename" 3 (1, 2, 1) write(keys::rename; id);
    Renamenx "renamenx" 3 (1, 2, 1) write(keys::rename; id);
    Copy "copy" -3 (1, 2, 1) write(keys::copy);
    Move "move" 3 (1, 1, 1) write(keys::move_key);
    Keys "keys" 2 (0, 0, 0) read(keys::keys);
    Scan "scan" -2 (0, 0, 0) read(keys::scan);
    Ttl "ttl" 2 (1, 1, 1) read(keys::ttl; id) [NO_TOUCH];
    Pttl "pttl" 2 (1, 1, 1) read(keys::ttl; id) [NO_TOUCH];
    Expiretime "expiretime" 2 (1, 1, 1) read(keys::ttl; id) [NO_TOUCH];
    Pexpiretime "pexpiretime" 2 (1, 1, 1) read(keys::ttl; id) [NO_TOUCH];
    Persist "persist" 2 (1, 1, 1) write(keys::persist);
    Expire "expire" -3 (1, 1, 1) write(keys::expire; id);
    Pexpire "pexpire" -3 (1, 1, 1) write(keys::expire; id);
    Expireat "expireat" -3 (1, 1, 1) write(keys::expire; id);
    Pexpireat "pexpireat" -3 (1, 1, 1) write(keys::expire; id);
    Object "object" -2 (2, 2, 1) read(keys::object) [NO_TOUCH];
    Dump "dump" 2 (1, 1, 1) read(dump::dump);
    Restore "restore" -4 (1, 1, 1) write(dump::restore);
    Sort "sort" -2 (1, 1, 1) write(sort::sort);
    SortRo "sort_ro" -2 (1, 1, 1) read(sort::sort_ro);
    MigrateKeys "migrate" -6 (3, 3, 1) write(migrate::migrate);
    // Strings.
    Get "get" 2 (1, 1, 1) read(strings::get);
    Set "set" -3 (1, 1, 1) write(strings::set);
    Setnx "setnx" 3 (1, 1, 1) write(strings::setnx);
    Getset "getset" 3 (1, 1, 1) write(strings::getset);
    Getdel "getdel" 2 (1, 1, 1) write(strings::getdel);
    Getex "getex" -2 (1, 1, 1) write(strings::getex);
    Setex "setex" 4 (1, 1, 1) write(strings::setex; id);
    Psetex "psetex" 4 (1, 1, 1) write(strings::setex; id);
    Mget "mget" -2 (1, -1, 1) read(strings::mget);
    Mset "mset" -3 (1, -1, 2) write(strings::mset; id);
    Msetnx "msetnx" -3 (1, -1, 2) write(strings::mset; id);
    Incr "incr" 2 (1, 1, 1) write(strings::incr; id);
    Decr "decr" 2 (1, 1, 1) write(strings::incr; id);
    Incrby "incrby" 3 (1, 1, 1) write(strings::incr; id);
    Decrby "decrby" 3 (1, 1, 1) write(strings::incr; id);
    Append "append" 3 (1, 1, 1) write(strings::append);
    Strlen "strlen" 2 (1, 1, 1) read(strings::strlen);
    Getrange "getrange" 4 (1, 1, 1) read(strings::getrange);
    Substr "substr" 4 (1, 1, 1) read(strings::getrange);
    Setrange "setrange" 4 (1, 1, 1) write(strings::setrange);
    Incrbyfloat "incrbyfloat" 3 (1, 1, 1) write(strings::incrbyfloat);
    Getbit "getbit" 3 (1, 1, 1) read(bitmaps::getbit);
    Setbit "setbit" 4 (1, 1, 1) write(bitmaps::setbit);
    Bitcount "bitcount" -2 (1, 1, 1) read(bitmaps::bitcount);
    Bitpos "bitpos" -3 (1, 1, 1) read(bitmaps::bitpos);
    Bitop "bitop" -4 (2, -1, 1) write(bitmaps::bitop);
    Lcs "lcs" -3 (1, 2, 1) read(strings::lcs);
    Bitfield "bitfield" -2 (1, 1, 1) write(bitmaps::bitfield);
    BitfieldRo "bitfield_ro" -2 (1, 1, 1) read(bitmaps::bitfield_ro);
    // Lists.
    Lpush "lpush" -3 (1, 1, 1) write(lists::push; id);
    Rpush "rpush" -3 (1, 1, 1) write(lists::push; id);
    Lpushx "lpushx" -3 (1, 1, 1) write(lists::push; id);
    Rpushx "rpushx" -3 (1, 1, 1) write(lists::push; id);
    Lpop "lpop" -2 (1, 1, 1) write(lists::pop; id);
    Rpop "rpop" -2 (1, 1, 1) write(lists::pop; id);
    Lrange "lrange" 4 (1, 1, 1) read(lists::lrange);
    Llen "llen" 2 (1, 1, 1) read(lists::llen);
    Lindex "lindex" 3 (1, 1, 1) read(lists::lindex);
    Lpos "lpos" -3 (1, 1, 1) read(lists::lpos);
    Lmove "lmove" 5 (1, 2, 1) write(lists::lmove; id);
    Rpoplpush "rpoplpush" 3 (1, 2, 1) write(lists::lmove; id);
    Blpop "blpop" -3 (1, -2, 1) write(pops::blocking_try; id) [BLOCKING];
    Brpop "brpop" -3 (1, -2, 1) write(pops::blocking_try; id) [BLOCKING];
    Brpoplpush "brpoplpush" 4 (1, 2, 1) write(pops::blocking_try; id) [BLOCKING];
    Blmove "blmove" 6 (1, 2, 1) write(pops::blocking_try; id) [BLOCKING];
    Lmpop "lmpop" -4 (0, 0, 0) write(pops::mpop; id);
    Blmpop "blmpop" -5 (0, 0, 0) write(pops::blocking_try; id) [BLOCKING];
    Zmpop "zmpop" -4 (0, 0, 0) write(pops::mpop; id);
    Bzmpop "bzmpop" -5 (0, 0, 0) write(pops::blocking_try; id) [BLOCKING];
    Ltrim "ltrim" 4 (1, 1, 1) write(lists::ltrim);
    Lset "lset" 4 (1, 1, 1) write(lists::lset);
    Linsert "linsert" 5 (1, 1, 1) write(lists::linsert);
    Lrem "lrem" 4 (1, 1, 1) write(lists::lrem);
    // Sets.
    Sadd "sadd" -3 (1, 1, 1) write(sets::sadd);
    Srem "srem" -3 (1, 1, 1) write(sets::srem);
    Smembers "smembers" 2 (1, 1, 1) read(sets::smembers);
    Sismember "sismember" 3 (1, 1, 1) read(sets::sismember);
    Smismember "smismember" -3 (1, 1, 1) read(sets::smismember);
    Scard "scard" 2 (1, 1, 1) read(sets::scard);
    Spop "spop" -2 (1, 1, 1) write(sets::spop);
    Srandmember "srandmember" -2 (1, 1, 1) read(sets::srandmember);
    Sinter "sinter" -2 (1, -1, 1) read(sets::sinter_union_diff; id);
    Sunion "sunion" -2 (1, -1, 1) read(sets::sinter_union_diff; id);
    Sdiff "sdiff" -2 (1, -1, 1) read(sets::sinter_union_diff; id);
    Sintercard "sintercard" -3 (0, 0, 0) read(sets::sintercard);
    Sinterstore "sinterstore" -3 (1, -1, 1) write(sets::sinter_union_diff_store; id);
    Sunionstore "sunionstore" -3 (1, -1, 1) write(sets::sinter_union_diff_store; id);
    Sdiffstore "sdiffstore" -3 (1, -1, 1) write(sets::sinter_union_diff_store; id);
    Smove "smove" 4 (1, 2, 1) write(sets::smove);
    // Hashes.
    Hset "hset" -4 (1, 1, 1) write(hashes::hset; id);
    Hmset "hmset" -4 (1, 1, 1) write(hashes::hset; id);
    Hsetnx "hsetnx" 4 (1, 1, 1) write(hashes::hset; id);
    Hget "hget" 3 (1, 1, 1) read(hashes::hget);
    Hstrlen "hstrlen" 3 (1, 1, 1) read(hashes::hstrlen);
    Hrandfield "hrandfield" -2 (1, 1, 1) read(hashes::hrandfield);
    Hincrbyfloat "hincrbyfloat" 4 (1, 1, 1) write(hashes::hincrbyfloat);
    Hmget "hmget" -3 (1, 1, 1) read(hashes::hmget);
    Hgetall "hgetall" 2 (1, 1, 1) read(hashes::hgetall_keys_vals; id);
    Hkeys "hkeys" 2 (1, 1, 1) read(hashes::hgetall_keys_vals; id);
    Hvals "hvals" 2 (1, 1, 1) read(hashes::hgetall_keys_vals; id);
    Hdel "hdel" -3 (1, 1, 1) write(hashes::hdel);
    Hlen "hlen" 2 (1, 1, 1) read(hashes::hlen);
    Hexists "hexists" 3 (1, 1, 1) read(hashes::hexists);
    Hincrby "hincrby" 4 (1, 1, 1) write(hashes::hincrby);
    // Sorted sets.
    Zadd "zadd" -4 (1, 1, 1) write(zsets::zadd; id);
    Zincrby "zincrby" 4 (1, 1, 1) write(zsets::zadd; id);
    Zrem "zrem" -3 (1, 1, 1) write(zsets::zrem);
    Zscore "zscore" 3 (1, 1, 1) read(zsets::zscore);
    Zmscore "zmscore" -3 (1, 1, 1) read(zsets::zmscore);
    Sscan "sscan" -3 (1, 1, 1) read(data::coll_scan; id);
    Hscan "hscan" -3 (1, 1, 1) read(data::coll_scan; id);
    Zscan "zscan" -3 (1, 1, 1) read(data::coll_scan; id);
    Zrandmember "zrandmember" -2 (1, 1, 1) read(zsets::zrandmember);
    Zremrangebyscore "zremrangebyscore" 4 (1, 1, 1) write(zsets::zremrange; id);
    Zremrangebyrank "zremrangebyrank" 4 (1, 1, 1) write(zsets::zremrange; id);
    Zcard "zcard" 2 (1, 1, 1) read(zsets::zcard);
    Zcount "zcount" 4 (1, 1, 1) read(zsets::zcount);
    Zrange "zrange" -4 (1, 1, 1) read(zsets::zrange; id);
    Zrevrange "zrevrange" -4 (1, 1, 1) read(zsets::zrange; id);
    Zrangebyscore "zrangebyscore" -4 (1, 1, 1) read(zsets::zrange; id);
    Zrevrangebyscore "zrevrangebyscore" -4 (1, 1, 1) read(zsets::zrange; id);
    Zpopmin "zpopmin" -2 (1, 1, 1) write(zsets::zpop; id);
    Zpopmax "zpopmax" -2 (1, 1, 1) write(zsets::zpop; id);
    Bzpopmin "bzpopmin" -3 (1, -2, 1) write(pops::blocking_try; id) [BLOCKING];
    Zunion "zunion" -3 (0, 0, 0) read(zsets::zunion_inter_diff; id);
    Zrank "zrank" 3 (1, 1, 1) read(zsets::zrank; id);
    Zrevrank "zrevrank" 3 (1, 1, 1) read(zsets::zrank; id);
    Zlexcount "zlexcount" 4 (1, 1, 1) read(zsets::zlexcount);
    Zrangebylex "zrangebylex" -4 (1, 1, 1) read(zsets::zrange; id);
    Zrevrangebylex "zrevrangebylex" -4 (1, 1, 1) read(zsets::zrange; id);
    Zremrangebylex "zremrangebylex" 4 (1, 1, 1) write(zsets::zremrangebylex);
    Zinter "zinter" -3 (0, 0, 0) read(zsets::zunion_inter_diff; id);
    Zdiff "zdiff" -3 (0, 0, 0) read(zsets::zunion_inter_diff; id);
    Zintercard "zintercard" -3 (0, 0, 0) read(zsets::zunion_inter_diff; id);
    Zunionstore "zunionstore" -4 (1, 1, 1) write(zsets::zunion_inter_diff_store; id);
    Zinterstore "zinterstore" -4 (1, 1, 1) write(zsets::zunion_inter_diff_store; id);
    Zdiffstore "zdiffstore" -4 (1, 1, 1) write(zsets::zunion_inter_diff_store; id);
    Zrangestore "zrangestore" -5 (1, 2, 1) write(zsets::zrangestore);
    Bzpopmax "bzpopmax" -3 (1, -2, 1) write(pops::blocking_try; id) [BLOCKING];
}

/// A command name as the lookup table keys it: up to 24 bytes, ASCII letters lower-cased,
/// packed little-endian into three words, with its length.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Packed([u64; 3], usize);

/// `name` packed, or `None` when longer than any command name.
#[inline]
fn pack(name: &[u8]) -> Option<Packed> {
    if name.len() > 24 {
        return None;
    }
    // Byte by byte: a command name is short, and a variable-length memcpy cost more.
    let mut w = [0u64; 3];
    for (i, &c) in name.iter().enumerate() {
        w[i / 8] |= (c as u64) << (8 * (i % 8));
    }
    for x in w.iter_mut().take(name.len().div_ceil(8)) {
        *x = lower(*x);
    }
    Some(Packed(w, name.len()))
}

/// The eight bytes of `x` with their ASCII capitals made small, all at once (SWAR): a byte
/// gets 0x20 added when it is in `A..=Z`, nothing else changes.
#[inline]
fn lower(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let low7 = x & !HIGH;
    let ge_a = low7 + ONES * (0x80 - b'A' as u64);
    let gt_z = low7 + ONES * (0x80 - b'Z' as u64 - 1);
    let upper = ge_a & !gt_z & !x & HIGH;
    x | (upper >> 2)
}

/// Slots of the open-addressing table: a power of two, over twice the commands.
const SLOTS: usize = 512;

#[inline]
fn slot_of(p: &Packed) -> usize {
    let h = (p.0[0] ^ p.0[1].rotate_left(21) ^ p.0[2].rotate_left(42) ^ p.1 as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 55) as usize % SLOTS
}

/// The command called `name` (any case). A packed-name table with linear probing: a
/// pipelined GET spent ~180 instructions per command in a hash map of byte strings here
/// (callgrind, redis-benchmark -P 16), this takes a fraction of that.
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    static MAP: OnceLock<Vec<Option<(Packed, &'static Spec)>>> = OnceLock::new();
    let map = MAP.get_or_init(|| {
        let mut m = vec![None; SLOTS];
        for s in TABLE {
            // cannot fail: the names are at most 24 bytes (checked by a test).
            let Some(p) = pack(s.name.as_bytes()) else {
                continue;
            };
            let mut i = slot_of(&p);
            while m[i].is_some() {
                i = (i + 1) % SLOTS;
            }
            m[i] = Some((p, s));
        }
        m
    });
    let p = pack(name)?;
    let mut i = slot_of(&p);
    loop {
        match &map[i] {
            None => return None,
            Some((q, s)) if *q == p => return Some(s),
            _ => i = (i + 1) % SLOTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_index_the_table() {
        for (i, s) in TABLE.iter().enumerate() {
            assert_eq!(s.id as usize, i, "{}", s.name);
            assert!(std::ptr::eq(spec(s.id), s));
            assert_eq!(lookup(s.name.as_bytes()).map(|x| x.id), Some(s.id));
            assert_eq!(
                lookup(s.name.to_ascii_uppercase().as_bytes()).map(|x| x.id),
                Some(s.id)
            );
        }
        assert!(TABLE.len() * 2 < SLOTS);
    }

    #[test]
    fn lowercasing_changes_only_capitals() {
        for c in 0..=255u8 {
            let x = u64::from_le_bytes([c, b'A', b'z', b'@', b'[', b'_', 0xC1, c]);
            let want = u64::from_le_bytes(
                [c, b'A', b'z', b'@', b'[', b'_', 0xC1, c].map(|b| b.to_ascii_lowercase()),
            );
            assert_eq!(lower(x), want, "byte {c}");
        }
        for bad in [
            &b"get\x7f"[..],
            b"ge",
            b"gett",
            b"sort\x7fro",
            b"g\xc5t",
            b"",
        ] {
            assert!(lookup(bad).is_none(), "{bad:?}");
        }
        assert!(lookup(b"SoRt_Ro").is_some());
    }
}
