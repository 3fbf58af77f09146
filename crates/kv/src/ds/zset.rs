//! Sorted sets: a dict member → node plus a skiplist ordered by (score, member) over the
//! same nodes — one block per element serves both.
//!
//! ```text
//! zset object: 0 dict header (DICT_HDR), 256 elements, 264 skiplist level, 272 tail node,
//!              280 reserved, 288 the head's links [ZMAX]
//! node:        0 next (dict chain), 8 hash, 16 meta (member length | level << 32 |
//!              size class << 48), 24 score (f64 bits), 32 backward node (0: first),
//!              40 links [level], then the member
//! link:        0 forward node (0: none), 8 span
//! ```
//!
//! Levels are random (p = 1/4, at most [`ZMAX`]) and stored in the node. Each link carries
//! its *span*, as Redis's skiplist does: how many level-0 steps it jumps (to the end of the
//! list, for a link with no forward node; the head counts as rank 0). A descent that adds the
//! spans it crosses knows the rank it stands at, so ZRANK, a range by rank, ZCOUNT and
//! ZLEXCOUNT are O(log n), like ZADD, ZREM, ZPOPMIN and the starts of score and lex ranges.
//! Lex ranges follow Redis's skiplist descent (members compared, scores ignored): they mean
//! something when all scores are equal.

use super::dict::{self, Kind, E_META};
use super::keyspace::free_classed;
use super::{class_of, damaged, intact, walk_bound, Mem, Store, Wtx};
use crate::heap::{HeapError, Off, Result};
use std::borrow::Cow;
use std::cmp::Ordering;

/// Most skiplist levels.
pub const ZMAX: usize = 24;
const Z_LEN: u64 = 256;
const Z_HEAD: u64 = 288;
/// Bytes of a link: the forward node and the span.
const LINK: u64 = 16;
/// Bytes of a zset object.
pub const ZSET_SIZE: u64 = Z_HEAD + LINK * ZMAX as u64;
const N_SCORE: u64 = 24;
const N_BACK: u64 = 32;
const N_FWD: u64 = 40;

/// Zset nodes keep their member after their forward links.
pub struct ZKind;

impl Kind for ZKind {
    #[inline]
    fn key_at(meta: u64) -> u64 {
        N_FWD + LINK * ((meta >> 32) as u8 as u64)
    }
}

/// Where link `i` of node `x` (the head when `x == z`) is: its forward node, then its span.
#[inline]
fn fwd_off(z: Off, x: Off, i: usize) -> Off {
    if x == z {
        z + Z_HEAD + LINK * i as u64
    } else {
        x + N_FWD + LINK * i as u64
    }
}

/// The span of link `i` of node `x`.
#[inline]
fn span<M: Mem>(m: &M, z: Off, x: Off, i: usize) -> u64 {
    m.u64(fwd_off(z, x, i) + 8)
}

/// A link's 16 bytes.
fn link_bytes(fwd: Off, span: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&fwd.to_le_bytes());
    b[8..16].copy_from_slice(&span.to_le_bytes());
    b
}

/// Score of node `n` (a NaN, which ZADD never stores, is damage: recorded, read as 0).
#[inline]
pub fn score<M: Mem>(m: &M, n: Off) -> f64 {
    let s = f64::from_bits(m.u64(n + N_SCORE));
    if s.is_nan() {
        damaged(n + N_SCORE);
        return 0.0;
    }
    s
}

/// Member of node `n`.
pub fn member<M: Mem>(m: &M, n: Off) -> Cow<'_, [u8]> {
    let meta = m.u64(n + E_META);
    m.bytes(n + ZKind::key_at(meta), meta as u32 as usize)
}

/// Levels of node `n` (1..=ZMAX; anything else is damage, recorded, read as 0 levels).
fn level_of<M: Mem>(m: &M, n: Off) -> usize {
    let l = (m.u64(n + E_META) >> 32) as u8 as usize;
    if l == 0 || l > ZMAX {
        damaged(n + E_META);
        return 0;
    }
    l
}

/// ZSCAN's walk: (member, score) of the member dict's buckets `cursor..` until at least
/// `count` were seen; returns the next cursor (0: done), as `set::scan`.
pub fn scan<M: Mem>(m: &M, z: Off, cursor: u64, count: u64, mut f: impl FnMut(&[u8], f64)) -> u64 {
    dict::scan(m, z, cursor, count, |n| f(&member(m, n), score(m, n)))
}

/// Elements of the zset.
pub fn len<M: Mem>(m: &M, z: Off) -> u64 {
    m.u64(z + Z_LEN)
}

/// Levels in use (1..=ZMAX; anything else is damage, recorded, read as 0 levels).
fn zlevel<M: Mem>(m: &M, z: Off) -> usize {
    let l = m.u64(z + Z_LEN + 8);
    if l == 0 || l > ZMAX as u64 {
        damaged(z + Z_LEN + 8);
        return 0;
    }
    l as usize
}

/// A new empty zset object.
pub fn create(w: &mut Wtx) -> Result<Off> {
    let (z, _) = w.alloc(ZSET_SIZE)?;
    dict::init(w, z)?;
    let mut rest = vec![0u8; (ZSET_SIZE - Z_LEN) as usize];
    rest[8..16].copy_from_slice(&1u64.to_le_bytes());
    w.write(z + Z_LEN, &rest)?;
    Ok(z)
}

fn cmp_node<M: Mem>(m: &M, n: Off, s: f64, mem: &[u8]) -> Ordering {
    let ns = score(m, n);
    match ns.partial_cmp(&s).unwrap_or(Ordering::Equal) {
        Ordering::Equal => (*member(m, n)).cmp(mem),
        o => o,
    }
}

/// The node of `member`, with its dict link.
fn find<M: Mem>(m: &M, st: &Store, z: Off, mem: &[u8]) -> Option<(Off, Off)> {
    dict::probe::<M, ZKind>(m, z, st.hash(mem), mem).found
}

/// The score of `member`.
pub fn score_of<M: Mem>(m: &M, st: &Store, z: Off, mem: &[u8]) -> Option<f64> {
    find(m, st, z, mem).map(|(n, _)| score(m, n))
}

/// The last node before (score, member) on each level, and its rank (the head's is 0). Each
/// level's walk is bounded by the zset's length (damage, recorded, beyond).
fn search<M: Mem>(m: &M, z: Off, s: f64, mem: &[u8]) -> ([Off; ZMAX], [u64; ZMAX]) {
    descend(m, z, |f, _| cmp_node(m, f, s, mem) == Ordering::Less)
}

/// The skiplist descent: on each level from the top, step forward while `ahead(next node, the
/// rank it has)`; the last node reached on each level and its rank (the head's is 0). `ahead`
/// must hold on a prefix of the list. Damage (a walk longer than the zset, a rank past its
/// length) is recorded and ends the descent.
fn descend<M: Mem>(
    m: &M,
    z: Off,
    mut ahead: impl FnMut(Off, u64) -> bool,
) -> ([Off; ZMAX], [u64; ZMAX]) {
    let mut update = [z; ZMAX];
    let mut rank = [0u64; ZMAX];
    let n = len(m, z);
    let mut x = z;
    let mut r = 0u64;
    let mut steps = walk_bound(m, n);
    // (zlevel ≤ ZMAX: the indexes are in range.)
    for i in (0..zlevel(m, z)).rev() {
        loop {
            let f = m.link(fwd_off(z, x, i));
            if f == 0 {
                break;
            }
            let rf = r.saturating_add(span(m, z, x, i));
            if !ahead(f, rf) {
                break;
            }
            if steps == 0 || rf > n {
                damaged(f);
                return (update, rank);
            }
            steps -= 1;
            (x, r) = (f, rf);
        }
        update[i] = x;
        rank[i] = r;
    }
    (update, rank)
}

fn random_level() -> usize {
    (1 + (super::rand_u64().trailing_zeros() / 2) as usize).min(ZMAX)
}

fn put_counts(w: &mut Wtx, z: Off, len: u64, level: usize, tail: Off) -> Result<()> {
    let mut b = [0u8; 24];
    b[0..8].copy_from_slice(&len.to_le_bytes());
    b[8..16].copy_from_slice(&(level as u64).to_le_bytes());
    b[16..24].copy_from_slice(&tail.to_le_bytes());
    w.write(z + Z_LEN, &b)
}

/// Link node `n` (level `lvl`, its score and member as given) into the skiplist; `node_head`
/// are its bytes from offset 0 up to its forward links (next, hash, meta), written together
/// with the links. `len_delta`: 1 for a new element, 0 for a re-insert.
#[allow(clippy::too_many_arguments)]
fn sl_link(
    w: &mut Wtx,
    z: Off,
    n: Off,
    lvl: usize,
    s: f64,
    mem: &[u8],
    node_head: Option<&[u8]>,
    len_delta: u64,
) -> Result<()> {
    let (update, rank) = search(w, z, s, mem);
    let mut level = zlevel(w, z);
    intact()?;
    if lvl == 0 || lvl > ZMAX {
        return Err(HeapError::Damaged(n));
    }
    // Nodes in the list now (a re-insert's node is counted in the length but unlinked).
    let linked = (len(w, z) + len_delta).wrapping_sub(1);
    // Levels above the current one start from the head (update[] is z, rank[] 0 there), whose
    // links there reach the end: over all `linked` nodes.
    let mut fw = Vec::with_capacity(lvl);
    let mut spans = Vec::with_capacity(lvl);
    for (i, u) in update.iter().enumerate().take(lvl) {
        let (f, sp) = if i >= level {
            (0, linked)
        } else {
            (w.u64(fwd_off(z, *u, i)), span(w, z, *u, i))
        };
        // The new node is `rank[0] - rank[i]` steps past update[i]: it takes the rest.
        let before = rank[0] - rank[i];
        let Some(rest) = sp.checked_sub(before) else {
            return Err(HeapError::Damaged(fwd_off(z, *u, i)));
        };
        fw.push(f);
        spans.push((rest, before + 1));
    }
    let back = if update[0] == z { 0 } else { update[0] };
    let mut buf = Vec::with_capacity(N_FWD as usize + LINK as usize * lvl + mem.len());
    if let Some(h) = node_head {
        buf.extend_from_slice(h);
    }
    buf.extend_from_slice(&s.to_bits().to_le_bytes());
    buf.extend_from_slice(&back.to_le_bytes());
    for (f, (rest, _)) in fw.iter().zip(&spans) {
        buf.extend_from_slice(&link_bytes(*f, *rest));
    }
    if node_head.is_some() {
        buf.extend_from_slice(mem);
        w.write(n, &buf)?;
    } else {
        w.write(n + N_SCORE, &buf)?;
    }
    for (i, u) in update.iter().enumerate().take(lvl) {
        w.write(fwd_off(z, *u, i), &link_bytes(n, spans[i].1))?;
    }
    // Links above the node's levels jump over it now.
    for (i, u) in update.iter().enumerate().take(level).skip(lvl) {
        w.write_u64(fwd_off(z, *u, i) + 8, span(w, z, *u, i) + 1)?;
    }
    let mut tail = w.u64(z + Z_LEN + 16);
    if fw[0] != 0 {
        w.write_u64(fw[0] + N_BACK, n)?;
    } else {
        tail = n;
    }
    level = level.max(lvl);
    let len = len(w, z) + len_delta;
    put_counts(w, z, len, level, tail)
}

/// Unlink node `n` from the skiplist. `len_delta`: 1 when the element goes, 0 for a
/// re-insert.
fn sl_unlink(w: &mut Wtx, z: Off, n: Off, len_delta: u64) -> Result<()> {
    let s = score(w, n);
    let mem = member(w, n).into_owned();
    let (update, _) = search(w, z, s, &mem);
    let lvl = level_of(w, n);
    intact()?;
    // Every level's link over the node loses a step; the node's own links are taken over.
    for (i, u) in update.iter().enumerate().take(zlevel(w, z)) {
        let fo = fwd_off(z, *u, i);
        let sp = span(w, z, *u, i);
        if i < lvl && w.u64(fo) == n {
            let nf = w.u64(fwd_off(z, n, i));
            let Some(joined) = sp.saturating_add(span(w, z, n, i)).checked_sub(1) else {
                return Err(HeapError::Damaged(fo));
            };
            w.write(fo, &link_bytes(nf, joined))?;
        } else {
            let Some(less) = sp.checked_sub(1) else {
                return Err(HeapError::Damaged(fo));
            };
            w.write_u64(fo + 8, less)?;
        }
    }
    let f0 = w.u64(fwd_off(z, n, 0));
    let back = w.u64(n + N_BACK);
    let mut tail = w.u64(z + Z_LEN + 16);
    if f0 != 0 {
        w.write_u64(f0 + N_BACK, back)?;
    } else {
        tail = back;
    }
    let mut level = zlevel(w, z);
    while level > 1 && w.u64(fwd_off(z, z, level - 1)) == 0 {
        level -= 1;
    }
    let len = len(w, z).wrapping_sub(len_delta);
    put_counts(w, z, len, level, tail)
}

/// ZADD's conditions.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddFlags {
    /// Only add new elements.
    pub nx: bool,
    /// Only update existing elements.
    pub xx: bool,
    /// Update only to a greater score.
    pub gt: bool,
    /// Update only to a lower score.
    pub lt: bool,
    /// The score is an increment.
    pub incr: bool,
}

/// What a ZADD of one element did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Added {
    /// A new element.
    New(f64),
    /// An existing element got a new score.
    Changed(f64),
    /// An existing element kept its score (same score given).
    Same(f64),
    /// Not done (NX / XX / GT / LT).
    Skipped,
    /// INCR would make the score NaN (nothing done).
    Nan,
}

/// Add or update `member` with `s` under `flags`.
pub fn add(w: &mut Wtx, st: &Store, z: Off, s: f64, mem: &[u8], flags: AddFlags) -> Result<Added> {
    // No negative zero: Redis keeps small sorted sets' integral scores as integers, so -0 reads
    // back as 0.
    let s = s + 0.0;
    let p = dict::probe::<_, ZKind>(w, z, st.hash(mem), mem);
    match p.found {
        None => {
            if flags.xx {
                return Ok(Added::Skipped);
            }
            let lvl = random_level();
            let size = N_FWD + LINK * lvl as u64 + mem.len() as u64;
            let (n, cap) = w.alloc(size)?;
            let meta = mem.len() as u64 | (lvl as u64) << 32 | (class_of(cap) as u64) << 48;
            let mut head = Vec::with_capacity(24);
            head.extend_from_slice(&p.head.to_le_bytes());
            head.extend_from_slice(&p.hash.to_le_bytes());
            head.extend_from_slice(&meta.to_le_bytes());
            sl_link(w, z, n, lvl, s, mem, Some(&head), 1)?;
            dict::insert(w, z, &p, n)?;
            Ok(Added::New(s))
        }
        Some((n, _)) => {
            if flags.nx {
                return Ok(Added::Skipped);
            }
            let cur = score(w, n);
            let new = if flags.incr { cur + s } else { s } + 0.0;
            if new.is_nan() {
                return Ok(Added::Nan);
            }
            if (flags.gt && new <= cur) || (flags.lt && new >= cur) {
                return Ok(Added::Skipped);
            }
            if new == cur {
                return Ok(Added::Same(cur));
            }
            // Still in order between its neighbours: only the score changes.
            let back = w.u64(n + N_BACK);
            let f0 = w.u64(fwd_off(z, n, 0));
            let memv = member(w, n).into_owned();
            if (back == 0 || cmp_node(w, back, new, &memv) == Ordering::Less)
                && (f0 == 0 || cmp_node(w, f0, new, &memv) == Ordering::Greater)
            {
                w.write_u64(n + N_SCORE, new.to_bits())?;
                return Ok(Added::Changed(new));
            }
            sl_unlink(w, z, n, 0)?;
            let lvl = level_of(w, n);
            sl_link(w, z, n, lvl, new, &memv, None, 0)?;
            Ok(Added::Changed(new))
        }
    }
}

/// Remove `member`; true if it was there. An emptied zset is left for the caller to delete.
pub fn remove(w: &mut Wtx, st: &Store, z: Off, mem: &[u8]) -> Result<bool> {
    let Some((n, link)) = find(w, st, z, mem) else {
        return Ok(false);
    };
    sl_unlink(w, z, n, 1)?;
    let meta = w.u64(n + E_META);
    dict::unlink(w, z, link, n)?;
    free_classed(w, n, meta)?;
    Ok(true)
}

/// Remove and return up to `count` elements with the lowest (or, `max`, highest) scores.
pub fn pop(
    w: &mut Wtx,
    st: &Store,
    z: Off,
    count: usize,
    max: bool,
) -> Result<Vec<(Vec<u8>, f64)>> {
    let mut out = Vec::new();
    while out.len() < count {
        let n = if max {
            w.link(z + Z_LEN + 16)
        } else {
            w.link(fwd_off(z, z, 0))
        };
        if n == 0 {
            break;
        }
        let mem = member(w, n).into_owned();
        out.push((mem.clone(), score(w, n)));
        if !remove(w, st, z, &mem)? {
            // The skiplist's end is not in the dict: the zset is damaged.
            return Err(HeapError::Damaged(n));
        }
        intact()?;
    }
    Ok(out)
}

/// One end of a score range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// The score.
    pub score: f64,
    /// Exclusive (`(` prefix).
    pub excl: bool,
}

impl Bound {
    fn above_min(&self, s: f64) -> bool {
        if self.excl {
            s > self.score
        } else {
            s >= self.score
        }
    }
    fn below_max(&self, s: f64) -> bool {
        if self.excl {
            s < self.score
        } else {
            s <= self.score
        }
    }
}

/// A range of scores to visit.
#[derive(Clone, Copy, Debug)]
pub struct ScoreRange {
    /// Lower bound.
    pub min: Bound,
    /// Upper bound.
    pub max: Bound,
    /// From the highest score down.
    pub rev: bool,
    /// Elements of the range to skip first.
    pub offset: u64,
    /// Most elements to visit (negative: all).
    pub limit: i64,
}

/// Visit the elements of range `r` in order (or reverse order), as (member, score).
pub fn range_by_score<M: Mem>(m: &M, z: Off, r: ScoreRange, mut f: impl FnMut(&[u8], f64)) {
    let ScoreRange {
        min,
        max,
        rev,
        offset,
        limit,
    } = r;
    let mut x = z;
    let mut steps = walk_bound(m, len(m, z));
    for i in (0..zlevel(m, z)).rev() {
        loop {
            let nx = m.link(fwd_off(z, x, i));
            if nx == 0 {
                break;
            }
            let s = score(m, nx);
            let go = if rev {
                max.below_max(s)
            } else {
                !min.above_min(s)
            };
            if go {
                if steps == 0 {
                    return damaged(nx);
                }
                steps -= 1;
                x = nx;
            } else {
                break;
            }
        }
    }
    // Scores must be in order along the walk, from the node before the range (the walk checks
    // the rest, and the node after it): a score out of order is damage, not data.
    let next = |n: Off| {
        if rev {
            m.link(n + N_BACK)
        } else {
            m.link(fwd_off(z, n, 0))
        }
    };
    let out_of_order = |a: f64, b: f64| if rev { b > a } else { b < a };
    let mut prev = if rev {
        f64::INFINITY
    } else {
        f64::NEG_INFINITY
    };
    let mut n = if rev {
        if x == z {
            0
        } else {
            x
        }
    } else {
        m.link(fwd_off(z, x, 0))
    };
    if x != z {
        let (xs, before) = (
            score(m, x),
            if rev {
                m.link(fwd_off(z, x, 0))
            } else {
                m.link(x + N_BACK)
            },
        );
        if before != 0 && out_of_order(score(m, before), xs) {
            return damaged(x);
        }
        if !rev {
            prev = xs;
        }
    }
    let (mut skip, mut left) = (offset, limit);
    let mut steps = walk_bound(m, len(m, z));
    while n != 0 && left != 0 {
        if steps == 0 {
            return damaged(n);
        }
        steps -= 1;
        let s = score(m, n);
        if out_of_order(prev, s) {
            return damaged(n);
        }
        prev = s;
        let inside = if rev {
            min.above_min(s)
        } else {
            max.below_max(s)
        };
        if !inside {
            let after = next(n);
            if after != 0 && out_of_order(s, score(m, after)) {
                damaged(n);
            }
            break;
        }
        if skip > 0 {
            skip -= 1;
        } else {
            f(&member(m, n), s);
            left -= 1;
        }
        n = next(n);
    }
}

/// Visit the elements of ranks `start..=stop` (resolved, `stop < len`; `rev`: ranks from the
/// highest score) in rank order.
pub fn range_by_rank<M: Mem>(
    m: &M,
    z: Off,
    start: u64,
    stop: u64,
    rev: bool,
    mut f: impl FnMut(&[u8], f64),
) {
    let n_all = len(m, z);
    if start > stop || stop >= n_all {
        return;
    }
    if n_all != dict::len(m, z) {
        // The skiplist's length and the dict's count must agree.
        return damaged(z + Z_LEN);
    }
    // Forward rank of the first element visited, found by its spans.
    let first = if rev { n_all - 1 - start } else { start };
    let mut n = node_at_rank(m, z, first);
    for _ in start..=stop {
        if n == 0 {
            return damaged(z);
        }
        f(&member(m, n), score(m, n));
        n = if rev {
            m.link(n + N_BACK)
        } else {
            m.link(fwd_off(z, n, 0))
        };
    }
    // The last rank visited must be the end of the list.
    if stop == n_all - 1 && n != 0 {
        damaged(z);
    }
}

/// The node at 0-based rank `r` (0: none, or damage, recorded): a descent adding spans.
fn node_at_rank<M: Mem>(m: &M, z: Off, r: u64) -> Off {
    let (update, rank) = descend(m, z, |_, rf| rf <= r + 1);
    if rank[0] == r + 1 && update[0] != z {
        update[0]
    } else {
        damaged(z + Z_HEAD);
        0
    }
}

/// The 0-based rank of `member` (from the lowest score), if it is there: O(log n).
pub fn rank<M: Mem>(m: &M, st: &Store, z: Off, mem: &[u8]) -> Option<u64> {
    let (n, _) = find(m, st, z, mem)?;
    let s = score(m, n);
    let (update, rank) = descend(m, z, |f, _| cmp_node(m, f, s, mem) != Ordering::Greater);
    if update[0] == n && rank[0] > 0 {
        Some(rank[0] - 1)
    } else {
        // In the dict but not in the list: damage.
        damaged(n);
        None
    }
}

/// How many elements have scores in `min..max`: the rank of the last one in it less the rank
/// of the last one below it (two descents, O(log n)).
pub fn count_by_score<M: Mem>(m: &M, z: Off, min: Bound, max: Bound) -> u64 {
    let (_, below) = descend(m, z, |f, _| !min.above_min(score(m, f)));
    let (_, upto) = descend(m, z, |f, _| max.below_max(score(m, f)));
    upto[0].saturating_sub(below[0])
}

/// One end of a lexicographic range (Redis's zslParseLexRangeItem): `-`, `+`, `[x`, `(x`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lex {
    /// `-`: below every member.
    Min,
    /// `+`: above every member.
    Max,
    /// `[x`: x included.
    Incl(Vec<u8>),
    /// `(x`: x excluded.
    Excl(Vec<u8>),
}

impl Lex {
    /// Parse a range item; `None` for anything else (Redis's "not valid string range item").
    pub fn parse(b: &[u8]) -> Option<Lex> {
        match b.first() {
            Some(b'-') if b.len() == 1 => Some(Lex::Min),
            Some(b'+') if b.len() == 1 => Some(Lex::Max),
            Some(b'[') => Some(Lex::Incl(b[1..].to_vec())),
            Some(b'(') => Some(Lex::Excl(b[1..].to_vec())),
            _ => None,
        }
    }

    /// `mem` is at or above this lower end (Redis's zslLexValueGteMin).
    pub fn gte_min(&self, mem: &[u8]) -> bool {
        match self {
            Lex::Min => true,
            Lex::Max => false,
            Lex::Incl(x) => mem >= x.as_slice(),
            Lex::Excl(x) => mem > x.as_slice(),
        }
    }

    /// `mem` is at or below this upper end (Redis's zslLexValueLteMax).
    pub fn lte_max(&self, mem: &[u8]) -> bool {
        match self {
            Lex::Min => false,
            Lex::Max => true,
            Lex::Incl(x) => mem <= x.as_slice(),
            Lex::Excl(x) => mem < x.as_slice(),
        }
    }
}

/// Visit the elements of the lexicographic range `min..max` as Redis's skiplist does: from the
/// first member at or above `min` (`rev`: the last at or below `max`, going down), skipping
/// `offset` elements, then at most `limit` (negative: all) while they stay in the range.
#[allow(clippy::too_many_arguments)]
pub fn range_by_lex<M: Mem>(
    m: &M,
    z: Off,
    min: &Lex,
    max: &Lex,
    rev: bool,
    offset: u64,
    limit: i64,
    mut f: impl FnMut(&[u8], f64),
) {
    let mut n = if rev {
        let (update, _) = descend(m, z, |x, _| max.lte_max(&member(m, x)));
        if update[0] == z {
            0
        } else {
            update[0]
        }
    } else {
        let (update, _) = descend(m, z, |x, _| !min.gte_min(&member(m, x)));
        m.link(fwd_off(z, update[0], 0))
    };
    let next = |n: Off| {
        if rev {
            m.link(n + N_BACK)
        } else {
            m.link(fwd_off(z, n, 0))
        }
    };
    let mut steps = walk_bound(m, len(m, z));
    for _ in 0..offset {
        if n == 0 {
            return;
        }
        if steps == 0 {
            return damaged(n);
        }
        steps -= 1;
        n = next(n);
    }
    let mut left = limit;
    while n != 0 && left != 0 {
        if steps == 0 {
            return damaged(n);
        }
        steps -= 1;
        let mem = member(m, n);
        let inside = if rev {
            min.gte_min(&mem)
        } else {
            max.lte_max(&mem)
        };
        if !inside {
            break;
        }
        f(&mem, score(m, n));
        left -= 1;
        n = next(n);
    }
}

/// How many elements the lexicographic range `min..max` holds (Redis's ZLEXCOUNT): the rank
/// of the last member at or below `max` less the rank of the last one below `min`.
pub fn count_by_lex<M: Mem>(m: &M, z: Off, min: &Lex, max: &Lex) -> u64 {
    let (_, below) = descend(m, z, |x, _| !min.gte_min(&member(m, x)));
    let (_, upto) = descend(m, z, |x, _| max.lte_max(&member(m, x)));
    upto[0].saturating_sub(below[0])
}

/// Free the zset entirely (callers bound its size first: see `garbage`).
pub fn free_all(w: &mut Wtx, z: Off) -> Result<()> {
    let mut entries = Vec::new();
    dict::for_each(w, z, |e| {
        entries.push(e);
        true
    });
    for e in entries {
        let meta = w.u64(e + E_META);
        free_classed(w, e, meta)?;
    }
    dict::free_table(w, z)?;
    w.free(z, ZSET_SIZE)
}

/// Check the skiplist's invariants (tests): order, backward links, tail, length, and that
/// the dict holds the same nodes.
pub fn check<M: Mem>(m: &M, z: Off) -> std::result::Result<(), String> {
    let mut n = m.u64(fwd_off(z, z, 0));
    let mut prev = 0;
    let mut count = 0;
    while n != 0 {
        if m.u64(n + N_BACK) != prev {
            return Err(format!("backward link of node {n}"));
        }
        if prev != 0 && cmp_node(m, prev, score(m, n), &member(m, n)) != Ordering::Less {
            return Err(format!("order at node {n}"));
        }
        count += 1;
        prev = n;
        n = m.u64(fwd_off(z, n, 0));
    }
    if m.u64(z + Z_LEN + 16) != prev {
        return Err("tail".into());
    }
    if count != len(m, z) || count != dict::len(m, z) {
        return Err(format!(
            "length {} / dict {} / walked {count}",
            len(m, z),
            dict::len(m, z)
        ));
    }
    // Spans: every link jumps exactly the level-0 steps to its forward node (to the end of the
    // list for a link with none), on every level in use.
    let mut rank_of = std::collections::HashMap::new();
    let mut x = m.u64(fwd_off(z, z, 0));
    while x != 0 {
        let r = rank_of.len() as u64 + 1;
        rank_of.insert(x, r);
        x = m.u64(fwd_off(z, x, 0));
    }
    for i in 0..zlevel(m, z) {
        let (mut x, mut rx) = (z, 0u64);
        loop {
            let f = m.u64(fwd_off(z, x, i));
            let rf = if f == 0 {
                count
            } else {
                match rank_of.get(&f) {
                    Some(&r) if r > rx => r,
                    _ => return Err(format!("node {f} on level {i} is not ahead on level 0")),
                }
            };
            if span(m, z, x, i) != rf - rx {
                return Err(format!(
                    "span of node {x} on level {i}: {} where it jumps {}",
                    span(m, z, x, i),
                    rf - rx
                ));
            }
            if f == 0 {
                break;
            }
            (x, rx) = (f, rf);
        }
    }
    // Every level is a sorted sub-list of level 0.
    for i in 1..zlevel(m, z) {
        let mut x = m.u64(fwd_off(z, z, i));
        let mut p = 0;
        while x != 0 {
            if level_of(m, x) <= i {
                return Err(format!("node {x} on level {i} above its level"));
            }
            if p != 0 && cmp_node(m, p, score(m, x), &member(m, x)) != Ordering::Less {
                return Err(format!("order on level {i}"));
            }
            p = x;
            x = m.u64(fwd_off(z, x, i));
        }
    }
    Ok(())
}
