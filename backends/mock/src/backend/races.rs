//! The race checker's comparisons: two uses of the same bytes, on the
//! device or within a capture, and the report of a race.

use super::*;

pub(super) fn site(x: &Access, capture: Option<u64>) -> UseSite {
    let at = match (x.who, capture) {
        (Who::Work { stream, pos }, _) => Submitted::Work {
            stream: MockStream(stream),
            seq: pos,
        },
        (Who::Node(index), c) => Submitted::Node(MockNode {
            capture: c.unwrap_or(0),
            index,
        }),
    };
    UseSite {
        stream: MockStream(x.stream),
        at,
        tag: x.tag,
        addr: x.addr,
        len: x.len,
    }
}

/// A use by work `pos` of stream `i` of the physical memory at offset
/// `off` of the mapping at `start` (the piece `[lo, hi)` of the use):
/// checked against the other streams' last uses of that memory through
/// another mapping (`last_use`, by stream: position, mapping, tag), which
/// must be complete or ordered before it (memory mapped at two addresses,
/// as an allocator's ghost mappings); then recorded as this stream's last.
pub(super) fn check_physical_use(
    streams: &[StreamState],
    last_use: &mut Vec<(u64, u64, u64)>,
    races: &mut Vec<Race>,
    (i, pos, start, off): (usize, u64, u64, u64),
    (lo, hi): (u64, u64),
    tag: u64,
) {
    let use_of = |stream: usize, pos: u64, tag: u64, addr: u64| Access {
        who: Who::Work {
            stream: stream as u32,
            pos,
        },
        stream: stream as u32,
        tag,
        addr,
        len: hi - lo,
        id: 0,
    };
    let clock = &streams[i].clock;
    for (a, &(pa, sa, ta)) in last_use.iter().enumerate() {
        let pending = pa > 0 && streams.get(a).is_some_and(|s| s.completed < pa);
        let ordered = clock.get(a).copied().unwrap_or(0) >= pa;
        if a != i && sa != start && ta != tag && pending && !ordered {
            // (the two addresses differ: the overlap is given as the later's)
            races.push(Race {
                earlier: site(&use_of(a, pa, ta, sa + off), None),
                later: site(&use_of(i, pos, tag, lo), None),
                overlap: (lo, hi),
                capture_id: None,
            });
        }
    }
    if last_use.len() <= i {
        last_use.resize(i + 1, (0, 0, 0));
    }
    last_use[i] = (pos, start, tag);
}

pub(super) fn make_race(earlier: &Access, later: &Access, capture: Option<u64>) -> Race {
    Race {
        earlier: site(earlier, capture),
        later: site(later, capture),
        overlap: (
            earlier.addr.max(later.addr),
            (earlier.addr + earlier.len).min(later.addr + later.len),
        ),
        capture_id: capture,
    }
}

/// Checks a use of node `idx` against the other uses of the capture's graph:
/// overlapping uses with another tag must be ancestors of `idx`.
pub(super) fn check_capture_use(
    cap: &mut CaptureState,
    id: u64,
    idx: u32,
    stream: usize,
    u: &MemUse,
    use_id: u64,
    races: &mut Vec<Race>,
) {
    let new = Access {
        who: Who::Node(idx),
        stream: stream as u32,
        tag: u.tag,
        addr: u.addr,
        len: u.len,
        id: use_id,
    };
    let mut cands: Vec<Access> = Vec::new();
    cap.shadow
        .visit_insert(u.addr, u.addr + u.len, new, true, |x| {
            if x.tag != u.tag && x.who != new.who && !cands.iter().any(|c| c.id == x.id) {
                cands.push(*x);
            }
            true
        });
    if cands.is_empty() {
        return;
    }
    let mut targets: HashSet<u32> = cands
        .iter()
        .filter_map(|c| match c.who {
            Who::Node(n) => Some(n),
            Who::Work { .. } => None,
        })
        .collect();
    let mut found: HashSet<u32> = HashSet::new();
    let mut seen = vec![false; cap.nodes.len()];
    let mut stack = vec![idx];
    while let Some(n) = stack.pop() {
        if targets.is_empty() {
            break;
        }
        for &d in &cap.nodes[n as usize].deps {
            if let Some(s) = seen.get_mut(d as usize)
                && !*s
            {
                *s = true;
                if targets.remove(&d) {
                    found.insert(d);
                }
                stack.push(d);
            }
        }
    }
    for c in &cands {
        if let Who::Node(n) = c.who
            && !found.contains(&n)
        {
            races.push(make_race(c, &new, Some(id)));
        }
    }
}
