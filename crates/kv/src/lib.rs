//! # tiermem-kv — a Redis-protocol key-value server on tiermem memory
//!
//! Layers (see `docs/kv.md`):
//! * [`resp`]: the RESP2 request parser and reply encoder, incremental and bounded;
//! * [`server`]: TCP and Unix-socket event loops with pipelining, calling a [`server::Service`]
//!   ([`iobuf`]: their input buffers, big ones mapped on their own);
//! * [`config`]: the server's settings, from a `redis.conf`-style file or flags;
//! * [`heap`]: the storage interface — a transactional heap addressed by offsets — and its
//!   engines (`vnvm`: durable; `volatile`: one registered anonymous region);
//! * `ds`, `commands`: Redis data structures over a heap and the command table;
//! * [`runtime`]: the settings that change while a server runs (CONFIG SET), read by the
//!   event loops without a lock;
//! * [`persistence`]: snapshots of the volatile heap (SAVE, BGSAVE, save points, load at start);
//! * [`instance`]: a whole server (engine, heap, commands, network) from a configuration;
//! * [`client`]: a small blocking RESP2 client (the CLI, the benchmarks and the tests use it).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod client;
pub mod commands;
pub mod config;
pub mod ds;
pub mod heap;
pub mod instance;
pub mod iobuf;
pub mod persistence;
pub mod resp;
pub mod runtime;
pub mod server;
