//! Reachability in a capture graph: for each stream of a capture, the set
//! of graph nodes known to precede its future work, grown by incremental
//! reverse walks (PyTorch #162186), as bitsets over dense node numbers.
#![forbid(unsafe_code)]

use crate::backend::GraphCapture;
use crate::engine::capture::FastMap;
use crate::error::Error;

/// Largest node number a visited bitset grows to (2^26 nodes, 8 MiB): a
/// larger number from the backend is treated as unnumbered.
const MAX_NODE_NUMBER: u32 = 1 << 26;

/// Sets bit `i`; true when it was clear.
#[inline]
fn bit_set(bits: &mut Vec<u64>, i: u32) -> bool {
    let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
    if w >= bits.len() {
        bits.resize(w + 1, 0);
    }
    let new = bits[w] & m == 0;
    bits[w] |= m;
    new
}

/// Whether bit `i` is set.
#[inline]
fn bit_test(bits: &[u64], i: u32) -> bool {
    bits.get((i / 64) as usize)
        .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
}

/// Dense numbers of the nodes of one capture's graph: the backend's
/// ([`GraphCapture::node_index`]) when it has them, else the engine's own.
struct Numbering<N> {
    /// `Some(true)`: the backend numbers nodes; `Some(false)`: the engine
    /// does; `None`: no node seen yet.
    backend: Option<bool>,
    /// The engine's numbers (backends without `node_index`).
    interned: FastMap<N, u32>,
    /// Engine numbers: the node of each number.
    nodes: Vec<N>,
    /// Engine numbers: each node's dependencies, once asked for, as a
    /// (start, length) range of `dep_numbers`. Every stream's walk of the
    /// capture shares them, so the backend is asked once per node and
    /// capture, not once per node and stream. (Stream capture never changes
    /// a node's dependencies once it is in the graph; an edge a program adds
    /// by hand later is missed, which can only withhold a reuse.)
    deps: Vec<Option<(u32, u32)>>,
    /// The numbers `deps` ranges point into.
    dep_numbers: Vec<u32>,
    /// The backend numbered some nodes and not others: no visited set is
    /// trusted any more (every check answers "not visited").
    broken: bool,
}

impl<N: Copy + Eq + std::hash::Hash> Numbering<N> {
    /// The number of `node`, numbering it if new; `None` when it cannot be
    /// numbered (then it is never counted as visited).
    #[inline]
    fn number<S, C: GraphCapture<S, Node = N>>(
        &mut self,
        backend: &C,
        capture: u64,
        node: N,
    ) -> Option<u32> {
        match (backend.node_index(capture, node), self.backend) {
            (Some(i), None | Some(true)) if i < MAX_NODE_NUMBER => {
                self.backend = Some(true);
                Some(i)
            }
            (None, None | Some(false)) => {
                self.backend = Some(false);
                let next = self.interned.len() as u32;
                let (nodes, deps) = (&mut self.nodes, &mut self.deps);
                Some(*self.interned.entry(node).or_insert_with(|| {
                    nodes.push(node);
                    deps.push(None);
                    next
                }))
            }
            _ => {
                self.broken = true;
                None
            }
        }
    }

    /// The number of `node` if it has one.
    #[inline]
    fn find<S, C: GraphCapture<S, Node = N>>(
        &self,
        backend: &C,
        capture: u64,
        node: N,
    ) -> Option<u32> {
        if self.broken {
            return None;
        }
        match self.backend {
            Some(true) => backend
                .node_index(capture, node)
                .filter(|&i| i < MAX_NODE_NUMBER),
            Some(false) => self.interned.get(&node).copied(),
            None => None,
        }
    }
}

/// The visited sets of one capture: for each stream, the graph nodes known
/// to precede its future work (ancestors-or-self of every terminal it has
/// had when walked), as bitsets over a dense numbering of the nodes.
pub(crate) struct Reach<S, N> {
    num: Numbering<N>,
    streams: Vec<(S, Vec<u64>)>,
    /// The walks' buffers: numbers to expand (engine numbers), nodes to
    /// expand (backend numbers), and one node's dependencies as the backend
    /// gives them.
    stack: Vec<u32>,
    nodes: Vec<N>,
    fetched: Vec<N>,
}

impl<S, N> Default for Reach<S, N> {
    fn default() -> Self {
        Self {
            num: Numbering {
                backend: None,
                interned: FastMap::default(),
                nodes: Vec::new(),
                deps: Vec::new(),
                dep_numbers: Vec::new(),
                broken: false,
            },
            streams: Vec::new(),
            stack: Vec::new(),
            nodes: Vec::new(),
            fetched: Vec::new(),
        }
    }
}

impl<S: Copy + Eq, N: Copy + Eq + std::hash::Hash> Reach<S, N> {
    /// The visited bitset of `stream`, if it has one.
    #[inline]
    fn bits(&self, stream: S) -> Option<&[u64]> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, b)| b.as_slice())
    }

    /// Whether every node of `nodes` is in `stream`'s visited set.
    pub(crate) fn all_visited<C: GraphCapture<S, Node = N>>(
        &self,
        backend: &C,
        capture: u64,
        stream: S,
        nodes: &[N],
    ) -> bool {
        let Some(bits) = self.bits(stream) else {
            return false;
        };
        nodes.iter().all(|&n| {
            self.num
                .find(backend, capture, n)
                .is_some_and(|i| bit_test(bits, i))
        })
    }

    /// Adds the ancestors-or-self of `terminals` to `stream`'s visited set
    /// (incremental reverse walk: a visited node is never expanded again).
    /// With the backend's numbers the backend marks the bitset itself
    /// ([`GraphCapture::mark_ancestors`]) when it can; otherwise the engine
    /// walks, one [`GraphCapture::extend_node_dependencies`] call per node
    /// expanded (with engine numbers, once per node and capture).
    pub(crate) fn visit<C: GraphCapture<S, Node = N>>(
        &mut self,
        backend: &C,
        capture: u64,
        stream: S,
        terminals: &[N],
    ) -> Result<(), Error> {
        let slot = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                self.streams.push((stream, Vec::new()));
                self.streams.len() - 1
            }
        };
        if self.num.backend.is_none()
            && let Some(&t) = terminals.first()
        {
            // The first node tells whether the backend numbers nodes.
            self.num.number(backend, capture, t);
        }
        let num = &mut self.num;
        let bits = &mut self.streams[slot].1;
        if num.backend == Some(true)
            && !num.broken
            && backend.mark_ancestors(capture, terminals, bits)?
        {
            return Ok(());
        }
        if num.backend == Some(true) && !num.broken {
            // The backend numbers nodes (known from an earlier node) but
            // could not mark these: walk here with its numbers.
            let mut broken = false;
            let r = walk_numbered(
                backend,
                capture,
                bits,
                terminals,
                &mut self.nodes,
                &mut self.fetched,
                &mut broken,
            );
            num.broken |= broken;
            r?;
        } else {
            // The engine numbers nodes: walk here, asking the backend for a
            // node's dependencies only the first time any stream expands it.
            walk_interned(
                backend,
                capture,
                num,
                bits,
                terminals,
                &mut self.stack,
                &mut self.fetched,
            )?;
        }
        Ok(())
    }
}

/// The reverse walk over the backend's node numbers (see [`Reach::visit`]):
/// marks in `bits` the ancestors-or-self of `terminals`; a node the backend
/// does not number sets `broken` and is not expanded.
fn walk_numbered<S, C: GraphCapture<S>>(
    backend: &C,
    capture: u64,
    bits: &mut Vec<u64>,
    terminals: &[C::Node],
    stack: &mut Vec<C::Node>,
    fetched: &mut Vec<C::Node>,
    broken: &mut bool,
) -> Result<(), Error> {
    let mut visit = |n: C::Node| match backend.node_index(capture, n) {
        Some(i) if i < MAX_NODE_NUMBER => bit_set(bits, i),
        _ => {
            *broken = true;
            false
        }
    };
    stack.clear();
    stack.extend(terminals.iter().copied().filter(|&n| visit(n)));
    while let Some(n) = stack.pop() {
        fetched.clear();
        backend.extend_node_dependencies(n, fetched)?;
        for &d in fetched.iter() {
            if visit(d) {
                stack.push(d);
            }
        }
    }
    Ok(())
}

/// The reverse walk over engine numbers (see [`Reach::visit`]): marks in
/// `bits` the ancestors-or-self of `terminals`, expanding each newly marked
/// node through `num`'s dependency cache.
fn walk_interned<S, C: GraphCapture<S>>(
    backend: &C,
    capture: u64,
    num: &mut Numbering<C::Node>,
    bits: &mut Vec<u64>,
    terminals: &[C::Node],
    stack: &mut Vec<u32>,
    fetched: &mut Vec<C::Node>,
) -> Result<(), Error> {
    stack.clear();
    for &t in terminals {
        if let Some(i) = num.number(backend, capture, t)
            && bit_set(bits, i)
        {
            stack.push(i);
        }
    }
    while let Some(i) = stack.pop() {
        let (start, len) = match num.deps[i as usize] {
            Some(r) => r,
            None => {
                fetched.clear();
                backend.extend_node_dependencies(num.nodes[i as usize], fetched)?;
                let start = num.dep_numbers.len() as u32;
                for &d in fetched.iter() {
                    if let Some(j) = num.number(backend, capture, d) {
                        num.dep_numbers.push(j);
                    }
                }
                let r = (start, num.dep_numbers.len() as u32 - start);
                num.deps[i as usize] = Some(r);
                r
            }
        };
        for k in start..start + len {
            let d = num.dep_numbers[k as usize];
            if bit_set(bits, d) {
                stack.push(d);
            }
        }
    }
    Ok(())
}
