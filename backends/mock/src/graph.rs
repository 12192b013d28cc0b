//! Capture graphs: nodes, edges and the memory uses they carry.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::types::{MemUse, MockStream};

/// A node of a capture graph: the capture id it belongs to and its index in
/// that graph (creation order, from 0).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MockNode {
    pub(crate) capture: u64,
    pub(crate) index: u32,
}

impl MockNode {
    /// Id of the capture whose graph holds the node.
    pub fn capture_id(self) -> u64 {
        self.capture
    }

    /// Index of the node in its graph (creation order, from 0).
    pub fn index(self) -> u32 {
        self.index
    }
}

impl fmt::Debug for MockNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}@c{}", self.index, self.capture)
    }
}

/// What a graph node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// A captured kernel ([`crate::MockBackend::launch`] or
    /// [`crate::MockBackend::use_memory`]).
    Kernel,
    /// An empty node (`add_empty_node`).
    Empty,
    /// A whole graph launched into the capture ([`crate::MockBackend::launch_graph`]).
    ChildGraph,
}

#[derive(Clone, Debug)]
pub(crate) struct GraphNode {
    pub kind: NodeKind,
    pub stream: Option<u32>,
    pub deps: Vec<u32>,
    pub uses: Vec<MemUse>,
}

#[derive(Debug)]
pub(crate) struct GraphData {
    pub capture_id: u64,
    pub nodes: Vec<GraphNode>,
}

/// Whether `from` reaches `to` following dependency edges backward from `to`
/// (i.e. there is a path `from -> ... -> to`); a node reaches itself.
pub(crate) fn reaches(nodes: &[GraphNode], from: u32, to: u32) -> bool {
    if from == to {
        return true;
    }
    let mut seen = vec![false; nodes.len()];
    let mut queue: VecDeque<u32> = VecDeque::from([to]);
    while let Some(n) = queue.pop_front() {
        let Some(node) = nodes.get(n as usize) else {
            continue;
        };
        for &d in &node.deps {
            if d == from {
                return true;
            }
            if let Some(s) = seen.get_mut(d as usize)
                && !*s
            {
                *s = true;
                queue.push_back(d);
            }
        }
    }
    false
}

/// The graph a successful capture produced. Cheap to clone (shared).
///
/// Nodes stay queryable through [`crate::MockBackend`]'s
/// `node_dependencies` as long as one clone of the graph is alive.
#[derive(Clone, Debug)]
pub struct MockGraph {
    pub(crate) data: Arc<GraphData>,
}

impl MockGraph {
    fn node(&self, index: u32) -> MockNode {
        MockNode {
            capture: self.data.capture_id,
            index,
        }
    }

    fn get(&self, node: MockNode) -> Option<&GraphNode> {
        if node.capture != self.data.capture_id {
            return None;
        }
        self.data.nodes.get(node.index as usize)
    }

    /// Id of the capture that produced the graph.
    pub fn capture_id(&self) -> u64 {
        self.data.capture_id
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.data.nodes.len()
    }

    /// All nodes in creation order.
    pub fn nodes(&self) -> Vec<MockNode> {
        (0..self.data.nodes.len() as u32)
            .map(|i| self.node(i))
            .collect()
    }

    /// Number of edges.
    pub fn edge_count(&self) -> usize {
        self.data.nodes.iter().map(|n| n.deps.len()).sum()
    }

    /// All edges `(dependency, dependent)`, ordered by dependent node.
    pub fn edges(&self) -> Vec<(MockNode, MockNode)> {
        let mut out = Vec::with_capacity(self.edge_count());
        for (i, n) in self.data.nodes.iter().enumerate() {
            for &d in &n.deps {
                out.push((self.node(d), self.node(i as u32)));
            }
        }
        out
    }

    /// Direct dependencies of `node`; `None` if it is not a node of this graph.
    pub fn dependencies(&self, node: MockNode) -> Option<Vec<MockNode>> {
        self.get(node)
            .map(|n| n.deps.iter().map(|&d| self.node(d)).collect())
    }

    /// Kind of `node`; `None` if it is not a node of this graph.
    pub fn kind(&self, node: MockNode) -> Option<NodeKind> {
        self.get(node).map(|n| n.kind)
    }

    /// The stream `node` was captured on (`None` for empty nodes or foreign nodes).
    pub fn stream(&self, node: MockNode) -> Option<MockStream> {
        self.get(node).and_then(|n| n.stream.map(MockStream))
    }

    /// Memory uses of `node` (empty for foreign nodes).
    pub fn node_uses(&self, node: MockNode) -> Vec<MemUse> {
        self.get(node).map(|n| n.uses.clone()).unwrap_or_default()
    }

    /// Every memory use of the graph with its node, in node order.
    pub fn uses(&self) -> Vec<(MockNode, MemUse)> {
        let mut out = Vec::new();
        for (i, n) in self.data.nodes.iter().enumerate() {
            for u in &n.uses {
                out.push((self.node(i as u32), *u));
            }
        }
        out
    }

    /// Nodes without dependencies.
    pub fn roots(&self) -> Vec<MockNode> {
        (0..self.data.nodes.len() as u32)
            .filter(|&i| self.data.nodes[i as usize].deps.is_empty())
            .map(|i| self.node(i))
            .collect()
    }

    /// Nodes nothing depends on.
    pub fn leaves(&self) -> Vec<MockNode> {
        let mut has_child = vec![false; self.data.nodes.len()];
        for n in &self.data.nodes {
            for &d in &n.deps {
                if let Some(c) = has_child.get_mut(d as usize) {
                    *c = true;
                }
            }
        }
        (0..self.data.nodes.len() as u32)
            .filter(|&i| !has_child[i as usize])
            .map(|i| self.node(i))
            .collect()
    }

    /// Whether there is a path `from -> ... -> to` (a node reaches itself).
    /// False when either node is not in this graph.
    pub fn reaches(&self, from: MockNode, to: MockNode) -> bool {
        self.get(from).is_some()
            && self.get(to).is_some()
            && reaches(&self.data.nodes, from.index, to.index)
    }
}
