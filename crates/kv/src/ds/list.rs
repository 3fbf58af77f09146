//! Lists: a quicklist — a doubly linked list of ~4 KiB nodes, each holding a run of packed
//! elements, so that pushes and pops write a few bytes, allocate once per ~4 KiB of elements,
//! and LRANGE walks node by node.
//!
//! ```text
//! list header (32 bytes): 0 head node, 8 tail node, 16 elements, 24 nodes
//! node: 0 prev, 8 next, 16 elements (u32), 20 start (u32), 24 end (u32), 28 capacity (u32),
//!       32 data: the node's elements are data[start..end]
//! element: length prefix (1 byte < 255, else 0xff + u32), bytes, length suffix (1 byte, else
//!       u32 + 0xff) — readable from either end
//! ```
//!
//! Elements grow inward from both sides of the data area: a node made by a push at the head
//! fills from its end down, one made at the tail from its start up; the first node of a list
//! starts in the middle. A push that does not fit the end node makes a new node.

use super::{damaged, get_len, intact, len_size, walk_bound, Mem, Wtx};
use crate::heap::{HeapError, Off, Result};

/// Bytes of a list header.
pub const LIST_HDR: u64 = 32;
const NODE_HDR: u64 = 32;
/// Usable bytes of a standard node.
const NODE_BLOCK: u64 = 4096;

/// Encoded size of an element of `n` bytes.
#[inline]
fn esz(n: usize) -> usize {
    2 * len_size(n) + n
}

fn encode(v: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(esz(v.len()));
    super::put_len(&mut b, v.len());
    b.extend_from_slice(v);
    if v.len() < 0xff {
        b.push(v.len() as u8);
    } else {
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
        b.push(0xff);
    }
    b
}

/// The element starting at `b[i..]` and the index after it; `None` when it runs past `b` or
/// its length suffix does not repeat its prefix (damage: the caller records it).
#[inline]
fn front_elem(b: &[u8], i: usize) -> Option<(&[u8], usize)> {
    let (len, hl) = get_len(b, i)?;
    let j = i + hl + len;
    // (get_len: `i + hl + len <= b.len()`, so the slice below is in range.)
    (back_len(b, j + hl)? == (len, hl)).then(|| (&b[i + hl..j], j + hl))
}

/// The element ending at `b[..j]` and the index where it starts; `None` as for
/// [`front_elem`].
#[inline]
fn back_elem(b: &[u8], j: usize) -> Option<(&[u8], usize)> {
    let (len, hl) = back_len(b, j)?;
    let i = j.checked_sub(2 * hl + len)?;
    // (get_len: `i + hl + len <= b.len()`, so the slice below is in range.)
    (get_len(b, i)? == (len, hl)).then(|| (&b[i + hl..i + hl + len], i))
}

/// (length, suffix bytes) of the element ending at `b[..j]` (`None`: past `b`).
#[inline]
fn back_len(b: &[u8], j: usize) -> Option<(usize, usize)> {
    let last = *b.get(j.checked_sub(1)?)?;
    if last != 0xff {
        Some((last as usize, 1))
    } else {
        let w = b.get(j.checked_sub(5)?..j - 1)?;
        Some((u32::from_le_bytes(w.try_into().ok()?) as usize, 5))
    }
}

#[derive(Clone, Copy, Debug)]
struct Hdr {
    head: Off,
    tail: Off,
    len: u64,
    nodes: u64,
}

fn hdr<M: Mem>(m: &M, l: Off) -> Hdr {
    Hdr {
        head: m.link(l),
        tail: m.link(l + 8),
        len: m.u64(l + 16),
        nodes: m.u64(l + 24),
    }
}

fn put_hdr(w: &mut Wtx, l: Off, h: &Hdr) -> Result<()> {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&h.head.to_le_bytes());
    b[8..16].copy_from_slice(&h.tail.to_le_bytes());
    b[16..24].copy_from_slice(&h.len.to_le_bytes());
    b[24..32].copy_from_slice(&h.nodes.to_le_bytes());
    w.write(l, &b)
}

#[derive(Clone, Copy, Debug)]
struct Node {
    prev: Off,
    next: Off,
    count: u32,
    start: u32,
    end: u32,
    cap: u32,
}

/// The node at `n`, checked: its elements inside its data area, the data area inside the
/// heap, no more elements than bytes. A node that fails is recorded as damage and reads as an
/// empty, unlinked one.
fn node<M: Mem>(m: &M, n: Off) -> Node {
    let b = m.bytes(n, 32);
    let h = |i: usize| {
        b.get(i..i + 4)
            .and_then(|w| w.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    let nd = Node {
        prev: m.link(n),
        next: m.link(n + 8),
        count: h(16),
        start: h(20),
        end: h(24),
        cap: h(28),
    };
    if nd.start > nd.end
        || nd.end > nd.cap
        || n + NODE_HDR + nd.cap as u64 > m.heap_len()
        || 2 * nd.count as u64 > (nd.end - nd.start) as u64
    {
        damaged(n);
        return Node {
            prev: 0,
            next: 0,
            count: 0,
            start: 0,
            end: 0,
            cap: 0,
        };
    }
    nd
}

fn node_bytes(n: &Node) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&n.prev.to_le_bytes());
    b[8..16].copy_from_slice(&n.next.to_le_bytes());
    b[16..20].copy_from_slice(&n.count.to_le_bytes());
    b[20..24].copy_from_slice(&n.start.to_le_bytes());
    b[24..28].copy_from_slice(&n.end.to_le_bytes());
    b[28..32].copy_from_slice(&n.cap.to_le_bytes());
    b
}

/// Write a node's counters (count, start, end; capacity unchanged).
fn put_counts(w: &mut Wtx, off: Off, n: &Node) -> Result<()> {
    let b = node_bytes(n);
    w.write(off + 16, &b[16..28])
}

/// Elements of the list.
pub fn len<M: Mem>(m: &M, l: Off) -> u64 {
    m.u64(l + 16)
}

/// Nodes of the list.
pub fn nodes<M: Mem>(m: &M, l: Off) -> u64 {
    m.u64(l + 24)
}

/// A new empty list header (the caller pushes at once: lists are never empty in the keyspace).
pub fn create(w: &mut Wtx) -> Result<Off> {
    let (l, _) = w.alloc(LIST_HDR)?;
    put_hdr(
        w,
        l,
        &Hdr {
            head: 0,
            tail: 0,
            len: 0,
            nodes: 0,
        },
    )?;
    Ok(l)
}

/// Allocate a node for at least `need` bytes of elements; returns (offset, data capacity).
fn new_node(w: &mut Wtx, need: usize) -> Result<(Off, u32)> {
    let size = (NODE_HDR + need as u64).max(NODE_BLOCK);
    let (n, cap) = w.alloc(size)?;
    Ok((n, (cap - NODE_HDR) as u32))
}

/// Push `elems` one by one at the head (`front`, LPUSH: the last ends up first) or the tail.
/// Returns the new length.
pub fn push(w: &mut Wtx, l: Off, elems: &[&[u8]], front: bool) -> Result<u64> {
    let mut h = hdr(w, l);
    intact()?;
    for v in elems {
        let e = encode(v);
        let sz = e.len() as u32;
        let end_node = if front { h.head } else { h.tail };
        if end_node != 0 {
            let mut n = node(w, end_node);
            intact()?;
            let room = if front { n.start } else { n.cap - n.end };
            if room >= sz {
                let at = if front { n.start - sz } else { n.end };
                w.write(end_node + NODE_HDR + at as u64, &e)?;
                if front {
                    n.start -= sz;
                } else {
                    n.end += sz;
                }
                n.count += 1;
                put_counts(w, end_node, &n)?;
                h.len += 1;
                continue;
            }
        }
        let (no, cap) = new_node(w, e.len())?;
        let start = if end_node == 0 {
            (cap - sz) / 2
        } else if front {
            cap - sz
        } else {
            0
        };
        let n = Node {
            prev: if front { 0 } else { end_node },
            next: if front { end_node } else { 0 },
            count: 1,
            start,
            end: start + sz,
            cap,
        };
        if start == 0 {
            let mut b = node_bytes(&n).to_vec();
            b.extend_from_slice(&e);
            w.write(no, &b)?;
        } else {
            w.write(no, &node_bytes(&n))?;
            w.write(no + NODE_HDR + start as u64, &e)?;
        }
        if end_node == 0 {
            h.head = no;
            h.tail = no;
        } else if front {
            w.write_u64(end_node, no)?;
            h.head = no;
        } else {
            w.write_u64(end_node + 8, no)?;
            h.tail = no;
        }
        h.nodes += 1;
        h.len += 1;
    }
    put_hdr(w, l, &h)?;
    Ok(h.len)
}

/// Pop up to `count` elements from the head (`front`) or the tail. An emptied list is left
/// (header only) for the caller to delete.
pub fn pop(w: &mut Wtx, l: Off, count: usize, front: bool) -> Result<Vec<Vec<u8>>> {
    let mut h = hdr(w, l);
    let mut out = Vec::with_capacity(count.min(h.len.min(1 << 16) as usize));
    let mut steps = walk_bound(w, h.nodes.saturating_add(1));
    while out.len() < count && h.len > 0 {
        let no = if front { h.head } else { h.tail };
        if no == 0 || steps == 0 {
            return Err(HeapError::Damaged(l));
        }
        steps -= 1;
        let mut n = node(w, no);
        intact()?;
        let data = w.bytes(no + NODE_HDR + n.start as u64, (n.end - n.start) as usize);
        let take = (count - out.len()).min(n.count as usize);
        let (mut i, mut j) = (0usize, data.len());
        for _ in 0..take {
            if front {
                let (v, next) = front_elem(&data, i).ok_or(HeapError::Damaged(no))?;
                out.push(v.to_vec());
                i = next;
            } else {
                let (v, prev) = back_elem(&data, j).ok_or(HeapError::Damaged(no))?;
                out.push(v.to_vec());
                j = prev;
            }
        }
        drop(data);
        h.len = h.len.saturating_sub(take as u64);
        n.count -= take as u32; // (take ≤ n.count)
        if n.count == 0 {
            // Unlink and free the node.
            if front {
                h.head = n.next;
                if n.next != 0 {
                    w.write_u64(n.next, 0)?;
                } else {
                    h.tail = 0;
                }
            } else {
                h.tail = n.prev;
                if n.prev != 0 {
                    w.write_u64(n.prev + 8, 0)?;
                } else {
                    h.head = 0;
                }
            }
            w.free(no, n.cap as u64 + NODE_HDR)?;
            h.nodes = h.nodes.wrapping_sub(1);
        } else {
            if front {
                n.start += i as u32;
            } else {
                n.end = n.start + j as u32;
            }
            put_counts(w, no, &n)?;
        }
    }
    put_hdr(w, l, &h)?;
    Ok(out)
}

/// Visit elements `start..=stop` (resolved, `stop < len`) in order until `f` returns false.
/// Damage met on the way (a link, node or element that cannot be right, fewer elements than
/// the header says, more after the last one) is recorded; the walk then stops.
pub fn range<M: Mem>(m: &M, l: Off, start: u64, stop: u64, mut f: impl FnMut(&[u8]) -> bool) {
    let h = hdr(m, l);
    if start > stop || stop >= h.len {
        return;
    }
    // The counters must agree with the end nodes (O(1)): one node holds every element;
    // two end nodes hold at most all of them.
    let (ch, ct) = (node(m, h.head).count as u64, node(m, h.tail).count as u64);
    let agree = if h.head == h.tail {
        h.nodes == 1 && ch == h.len
    } else {
        h.nodes >= 2 && ch + ct <= h.len
    };
    if !agree {
        return damaged(l);
    }
    // (The nodes before the first element are met twice at most.)
    let mut steps = walk_bound(m, h.nodes.saturating_mul(2).saturating_add(1));
    // Find the node holding `start`, walking from the nearer end.
    let (mut no, mut skip);
    if start <= h.len / 2 {
        no = h.head;
        skip = start;
        loop {
            if no == 0 || steps == 0 {
                return damaged(l);
            }
            steps -= 1;
            let c = node(m, no).count as u64;
            if skip < c {
                break;
            }
            skip -= c;
            no = m.link(no + 8);
        }
    } else {
        no = h.tail;
        let mut from_end = h.len - 1 - start; // elements after `start`
        loop {
            if no == 0 || steps == 0 {
                return damaged(l);
            }
            steps -= 1;
            let c = node(m, no).count as u64;
            if from_end < c {
                skip = c - 1 - from_end;
                break;
            }
            from_end -= c;
            no = m.link(no);
        }
    }
    let to_end = stop == h.len - 1;
    let mut left = stop - start + 1;
    while no != 0 && left > 0 {
        if steps == 0 {
            return damaged(l);
        }
        steps -= 1;
        let n = node(m, no);
        let data = m.bytes(no + NODE_HDR + n.start as u64, (n.end - n.start) as usize);
        let mut i = 0;
        for k in 0..n.count {
            let Some((v, next)) = front_elem(&data, i) else {
                return damaged(no);
            };
            if skip > 0 {
                skip -= 1;
            } else {
                if !f(v) {
                    return;
                }
                left -= 1;
                if left == 0 {
                    // The list's last element must be its last node's last one.
                    if to_end && (k + 1 != n.count || next != data.len() || n.next != 0) {
                        damaged(no);
                    }
                    return;
                }
            }
            i = next;
        }
        if i != data.len() {
            return damaged(no);
        }
        no = n.next;
    }
    if left > 0 {
        damaged(l);
    }
}

/// The element at index `i` (resolved).
pub fn index<M: Mem>(m: &M, l: Off, i: u64) -> Option<Vec<u8>> {
    let mut out = None;
    range(m, l, i, i, |v| {
        out = Some(v.to_vec());
        false
    });
    out
}

/// What an [`edit`] callback did with one node's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edited {
    /// The elements changed: the node is rewritten with them.
    pub changed: bool,
    /// Stop the walk after this node.
    pub stop: bool,
}

/// Walks the list node by node from the head (or the tail with `rev`), handing `f` each
/// node's elements in list order; a node whose elements `f` changed is rewritten in place when
/// they fit its capacity, split over new nodes linked in its place when they do not, and
/// unlinked and freed when `f` emptied it. What LSET, LINSERT and LREM need: the walk is
/// Redis's O(N), the writes are the nodes changed. Returns the list's new length (an emptied
/// list is left, header only, for the caller to delete).
pub fn edit(
    w: &mut Wtx,
    l: Off,
    rev: bool,
    mut f: impl FnMut(&mut Vec<Vec<u8>>) -> Edited,
) -> Result<u64> {
    let mut h = hdr(w, l);
    intact()?;
    let mut no = if rev { h.tail } else { h.head };
    let mut steps = walk_bound(w, h.nodes.saturating_add(1));
    while no != 0 {
        if steps == 0 {
            return Err(HeapError::Damaged(l));
        }
        steps -= 1;
        let n = node(w, no);
        intact()?;
        let mut elems = Vec::with_capacity(n.count as usize);
        {
            let data = w.bytes(no + NODE_HDR + n.start as u64, (n.end - n.start) as usize);
            let mut i = 0;
            for _ in 0..n.count {
                let (v, next) = front_elem(&data, i).ok_or(HeapError::Damaged(no))?;
                elems.push(v.to_vec());
                i = next;
            }
            if i != data.len() {
                return Err(HeapError::Damaged(no));
            }
        }
        let next = if rev { n.prev } else { n.next };
        let e = f(&mut elems);
        if e.changed {
            h.len = h.len - n.count as u64 + elems.len() as u64;
            rewrite_node(w, &mut h, no, &n, &elems)?;
        }
        if e.stop {
            break;
        }
        no = next;
    }
    put_hdr(w, l, &h)?;
    Ok(h.len)
}

/// Gives node `no` (read as `n`) the elements `elems`: in place, centred in its data area, when
/// they fit; else the first node-full in it and the rest in new nodes linked after it; unlinked
/// and freed when `elems` is empty. Updates the header's node links and count (not its length).
fn rewrite_node(w: &mut Wtx, h: &mut Hdr, no: Off, n: &Node, elems: &[Vec<u8>]) -> Result<()> {
    if elems.is_empty() {
        if n.prev != 0 {
            w.write_u64(n.prev + 8, n.next)?;
        } else {
            h.head = n.next;
        }
        if n.next != 0 {
            w.write_u64(n.next, n.prev)?;
        } else {
            h.tail = n.prev;
        }
        w.free(no, n.cap as u64 + NODE_HDR)?;
        h.nodes = h.nodes.wrapping_sub(1);
        return Ok(());
    }
    // Chunks of encoded elements, each filling at most a node (the first: this node's capacity;
    // the others: a standard node, or one element's own size).
    let mut chunks: Vec<(Vec<u8>, u32)> = Vec::new();
    let mut cur: (Vec<u8>, u32) = (Vec::new(), 0);
    for v in elems {
        let e = encode(v);
        let limit = if chunks.is_empty() {
            n.cap as usize
        } else {
            (NODE_BLOCK - NODE_HDR) as usize
        };
        if cur.1 > 0 && cur.0.len() + e.len() > limit {
            chunks.push(std::mem::take(&mut cur));
        }
        cur.0.extend_from_slice(&e);
        cur.1 += 1;
    }
    chunks.push(cur);
    if chunks[0].0.len() > n.cap as usize {
        // One element larger than this node: every chunk goes to a new node.
        chunks.insert(0, (Vec::new(), 0));
    }
    // This node keeps the first chunk (possibly none: then it is dropped after the others are
    // linked in).
    let (first, rest) = chunks.split_first().expect("a chunk");
    let mut last = no;
    let mut last_next = n.next;
    if first.1 > 0 {
        let sz = first.0.len() as u32;
        let start = (n.cap - sz) / 2;
        let nn = Node {
            count: first.1,
            start,
            end: start + sz,
            ..*n
        };
        w.write(no + NODE_HDR + start as u64, &first.0)?;
        put_counts(w, no, &nn)?;
    }
    for (bytes, count) in rest {
        let (nb, cap) = new_node(w, bytes.len())?;
        let sz = bytes.len() as u32;
        let start = (cap - sz) / 2;
        let nn = Node {
            prev: last,
            next: last_next,
            count: *count,
            start,
            end: start + sz,
            cap,
        };
        w.write(nb, &node_bytes(&nn))?;
        w.write(nb + NODE_HDR + start as u64, bytes)?;
        w.write_u64(last + 8, nb)?;
        if last_next != 0 {
            w.write_u64(last_next, nb)?;
        } else {
            h.tail = nb;
        }
        h.nodes += 1;
        last = nb;
        last_next = nn.next;
    }
    if first.1 == 0 {
        // This node holds nothing now: unlink it (its links are re-read: the new nodes follow).
        let now = node(w, no);
        intact()?;
        rewrite_node(w, h, no, &now, &[])?;
    }
    Ok(())
}

/// Free one node (garbage collection); returns the next node.
pub fn free_node(w: &mut Wtx, no: Off) -> Result<Off> {
    let n = node(w, no);
    intact()?;
    w.free(no, n.cap as u64 + NODE_HDR)?;
    Ok(n.next)
}

/// The first node.
pub fn head<M: Mem>(m: &M, l: Off) -> Off {
    m.link(l)
}

/// Free the list entirely (callers bound its size first: see `garbage`).
pub fn free_all(w: &mut Wtx, l: Off) -> Result<()> {
    let mut no = head(w, l);
    let mut steps = walk_bound(w, nodes(w, l));
    while no != 0 {
        if steps == 0 {
            return Err(HeapError::Damaged(l));
        }
        steps -= 1;
        no = free_node(w, no)?;
    }
    w.free(l, LIST_HDR)
}

/// The elements' bytes as read (helper for tests).
pub fn to_vec<M: Mem>(m: &M, l: Off) -> Vec<Vec<u8>> {
    let n = len(m, l);
    let mut v = Vec::with_capacity(n.min(1 << 16) as usize);
    if n > 0 {
        range(m, l, 0, n - 1, |e| {
            v.push(e.to_vec());
            true
        });
    }
    v
}
