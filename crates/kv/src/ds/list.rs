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

use super::{get_len, len_size, Mem, Wtx};
use crate::heap::{Off, Result};

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

/// (length, suffix bytes) of the element ending at `b[..j]`.
#[inline]
fn back_len(b: &[u8], j: usize) -> (usize, usize) {
    if b[j - 1] != 0xff {
        (b[j - 1] as usize, 1)
    } else {
        (
            u32::from_le_bytes(b[j - 5..j - 1].try_into().expect("4")) as usize,
            5,
        )
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
    let b = m.bytes(l, 32);
    let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
    Hdr {
        head: w(0),
        tail: w(8),
        len: w(16),
        nodes: w(24),
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

fn node<M: Mem>(m: &M, n: Off) -> Node {
    let b = m.bytes(n, 32);
    let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
    let h = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
    Node {
        prev: w(0),
        next: w(8),
        count: h(16),
        start: h(20),
        end: h(24),
        cap: h(28),
    }
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
    for v in elems {
        let e = encode(v);
        let sz = e.len() as u32;
        let end_node = if front { h.head } else { h.tail };
        if end_node != 0 {
            let mut n = node(w, end_node);
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
    let mut out = Vec::with_capacity(count.min(h.len as usize));
    while out.len() < count && h.len > 0 {
        let no = if front { h.head } else { h.tail };
        let mut n = node(w, no);
        let data = w.bytes(no + NODE_HDR + n.start as u64, (n.end - n.start) as usize);
        let take = (count - out.len()).min(n.count as usize);
        let (mut i, mut j) = (0usize, data.len());
        for _ in 0..take {
            if front {
                let (len, hl) = get_len(&data, i);
                out.push(data[i + hl..i + hl + len].to_vec());
                i += 2 * hl + len;
            } else {
                let (len, hl) = back_len(&data, j);
                out.push(data[j - hl - len..j - hl].to_vec());
                j -= 2 * hl + len;
            }
        }
        drop(data);
        h.len -= take as u64;
        n.count -= take as u32;
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
            h.nodes -= 1;
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
pub fn range<M: Mem>(m: &M, l: Off, start: u64, stop: u64, mut f: impl FnMut(&[u8]) -> bool) {
    let h = hdr(m, l);
    if start > stop || stop >= h.len {
        return;
    }
    // Find the node holding `start`, walking from the nearer end.
    let (mut no, mut skip);
    if start <= h.len / 2 {
        no = h.head;
        skip = start;
        loop {
            let c = m.u32(no + 16) as u64;
            if skip < c {
                break;
            }
            skip -= c;
            no = m.u64(no + 8);
        }
    } else {
        no = h.tail;
        let mut from_end = h.len - 1 - start; // elements after `start`
        loop {
            let c = m.u32(no + 16) as u64;
            if from_end < c {
                skip = c - 1 - from_end;
                break;
            }
            from_end -= c;
            no = m.u64(no);
        }
    }
    let mut left = stop - start + 1;
    while no != 0 && left > 0 {
        let n = node(m, no);
        let data = m.bytes(no + NODE_HDR + n.start as u64, (n.end - n.start) as usize);
        let mut i = 0;
        for _ in 0..n.count {
            let (len, hl) = get_len(&data, i);
            if skip > 0 {
                skip -= 1;
            } else {
                if !f(&data[i + hl..i + hl + len]) {
                    return;
                }
                left -= 1;
                if left == 0 {
                    return;
                }
            }
            i += 2 * hl + len;
        }
        no = n.next;
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

/// Free one node (garbage collection); returns the next node.
pub fn free_node(w: &mut Wtx, no: Off) -> Result<Off> {
    let n = node(w, no);
    w.free(no, n.cap as u64 + NODE_HDR)?;
    Ok(n.next)
}

/// The first node.
pub fn head<M: Mem>(m: &M, l: Off) -> Off {
    m.u64(l)
}

/// Free the list entirely (callers bound its size first: see `garbage`).
pub fn free_all(w: &mut Wtx, l: Off) -> Result<()> {
    let mut no = head(w, l);
    while no != 0 {
        no = free_node(w, no)?;
    }
    w.free(l, LIST_HDR)
}

/// The elements' bytes as read (helper for tests).
pub fn to_vec<M: Mem>(m: &M, l: Off) -> Vec<Vec<u8>> {
    let n = len(m, l);
    let mut v = Vec::with_capacity(n as usize);
    if n > 0 {
        range(m, l, 0, n - 1, |e| {
            v.push(e.to_vec());
            true
        });
    }
    v
}
