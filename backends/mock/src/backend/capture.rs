//! Graph capture: capture state, dependencies, nodes, and the checks of
//! uses made during capture.

use super::*;

impl State {
    // ----- capture -------------------------------------------------------

    pub(super) fn capture_state(
        &self,
        s: MockStream,
        terminals: &mut Vec<MockNode>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        let i = self.stream_idx("capture_info", s)?;
        let st = &self.streams[i];
        terminals.clear();
        let Some(id) = st.capture else {
            return Ok((CaptureStatus::None, 0));
        };
        Ok(match self.captures.get(&id) {
            Some(c) if c.status == CaptureStatus::Active => {
                terminals.extend(
                    st.terminals
                        .iter()
                        .map(|&index| MockNode { capture: id, index }),
                );
                (CaptureStatus::Active, id)
            }
            Some(_) => (CaptureStatus::Invalidated, id),
            None => (CaptureStatus::None, 0),
        })
    }

    /// The walk of `GraphCapture::mark_ancestors` over the graph of capture
    /// `capture` while it is being captured (node numbers are indices);
    /// `None` when `from` holds a node of another graph or out of range.
    /// Returns the number of nodes expanded.
    pub(super) fn mark_ancestors(
        &mut self,
        capture: u64,
        from: &[MockNode],
        bits: &mut Vec<u64>,
    ) -> Option<u64> {
        let nodes = &self.captures.get(&capture)?.nodes;
        if from
            .iter()
            .any(|n| n.capture != capture || n.index as usize >= nodes.len())
        {
            return None;
        }
        // Every index is below the node count: size the bitset once.
        let words = nodes.len().div_ceil(64);
        if bits.len() < words {
            bits.resize(words, 0);
        }
        let bits = &mut bits[..words];
        #[inline]
        fn mark(bits: &mut [u64], i: u32) -> bool {
            let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
            let old = bits[w];
            bits[w] = old | m;
            old & m == 0
        }
        let stack = &mut self.mark_stack;
        stack.clear();
        for n in from {
            if mark(bits, n.index) {
                stack.push(n.index);
            }
        }
        let mut expanded = 0;
        while let Some(i) = stack.pop() {
            expanded += 1;
            for &d in &nodes[i as usize].deps {
                if mark(bits, d) {
                    stack.push(d);
                }
            }
        }
        Some(expanded)
    }

    pub(super) fn extend_node_dependencies(
        &mut self,
        node: MockNode,
        out: &mut Vec<MockNode>,
    ) -> Result<(), BackendError> {
        let map = |deps: &[u32], out: &mut Vec<MockNode>| {
            out.extend(deps.iter().map(|&index| MockNode {
                capture: node.capture,
                index,
            }));
        };
        let bad = |what: &str| {
            err(
                "node_dependencies",
                codes::INVALID_VALUE,
                format!("{node:?}: {what}"),
            )
        };
        if let Some(c) = self.captures.get(&node.capture) {
            let n = c
                .nodes
                .get(node.index as usize)
                .ok_or_else(|| bad("no such node in the capturing graph"))?;
            map(&n.deps, out);
            return Ok(());
        }
        match self.graphs.get(&node.capture).map(Weak::upgrade) {
            Some(Some(g)) => {
                let n = g
                    .nodes
                    .get(node.index as usize)
                    .ok_or_else(|| bad("no such node in the graph"))?;
                map(&n.deps, out);
                Ok(())
            }
            Some(None) => {
                self.graphs.remove(&node.capture);
                Err(bad("its graph was destroyed"))
            }
            None => Err(bad("unknown capture")),
        }
    }

    pub(super) fn capturing_id(&self, call: &'static str, i: usize) -> Result<u64, BackendError> {
        match self.active_capture(call, i)? {
            Some(id) => Ok(id),
            None => Err(err(
                call,
                codes::ILLEGAL_STATE,
                format!("stream{i} is not capturing"),
            )),
        }
    }

    pub(super) fn add_empty_node(
        &mut self,
        s: MockStream,
        deps: &[MockNode],
    ) -> Result<MockNode, BackendError> {
        const CALL: &str = "add_empty_node";
        let i = self.stream_idx(CALL, s)?;
        let id = self.capturing_id(CALL, i)?;
        let deps = self.check_nodes(CALL, id, deps)?;
        let cap = self
            .captures
            .get_mut(&id)
            .ok_or_else(|| err(CALL, codes::ILLEGAL_STATE, "capture vanished"))?;
        let index = cap.nodes.len() as u32;
        cap.nodes.push(GraphNode {
            kind: NodeKind::Empty,
            stream: None,
            deps,
            uses: Vec::new(),
        });
        Ok(MockNode { capture: id, index })
    }

    pub(super) fn update_capture_dependencies(
        &mut self,
        s: MockStream,
        nodes: &[MockNode],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        const CALL: &str = "update_capture_dependencies";
        let i = self.stream_idx(CALL, s)?;
        let id = self.capturing_id(CALL, i)?;
        let nodes = self.check_nodes(CALL, id, nodes)?;
        let t = &mut self.streams[i].terminals;
        if mode == DependencyUpdate::Set {
            t.clear();
        }
        push_unique(t, nodes);
        Ok(())
    }

    pub(super) fn begin_capture(&mut self, s: MockStream) -> Result<u64, BackendError> {
        const CALL: &str = "begin_capture";
        let i = self.stream_idx(CALL, s)?;
        if i == 0 {
            return Err(err(
                CALL,
                codes::STREAM_CAPTURE_UNSUPPORTED,
                "the legacy default stream cannot be captured",
            ));
        }
        if let Some(id) = self.streams[i].capture {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!("{s} is already capturing (capture {id})"),
            ));
        }
        let id = self.next_capture;
        self.next_capture += 1;
        self.captures.insert(
            id,
            CaptureState {
                origin: i,
                status: CaptureStatus::Active,
                reason: None,
                nodes: Vec::new(),
                members: BTreeSet::from([i]),
                shadow: PieceMap::default(),
            },
        );
        let st = &mut self.streams[i];
        st.capture = Some(id);
        st.terminals.clear();
        Ok(id)
    }

    pub(super) fn end_capture(&mut self, s: MockStream) -> Result<MockGraph, BackendError> {
        const CALL: &str = "end_capture";
        let i = self.stream_idx(CALL, s)?;
        let Some(id) = self.streams[i].capture else {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!("{s} is not capturing"),
            ));
        };
        let origin = self.captures.get(&id).map_or(i, |c| c.origin);
        if origin != i {
            let reason = format!("end_capture on {s}, but capture {id} began on stream{origin}");
            self.invalidate(id, reason.clone());
            return Err(err(CALL, codes::STREAM_CAPTURE_UNMATCHED, reason));
        }
        let Some(cap) = self.captures.remove(&id) else {
            self.streams[i].capture = None;
            return Err(err(CALL, codes::ILLEGAL_STATE, "capture vanished"));
        };
        // Ancestors-or-self of the origin's terminals.
        let mut joined = vec![false; cap.nodes.len()];
        let mut stack: Vec<u32> = self.streams[i].terminals.clone();
        while let Some(n) = stack.pop() {
            if let Some(j) = joined.get_mut(n as usize)
                && !*j
            {
                *j = true;
                stack.extend(cap.nodes[n as usize].deps.iter().copied());
            }
        }
        let mut unjoined = None;
        for &m in &cap.members {
            let st = &mut self.streams[m];
            if m != i
                && unjoined.is_none()
                && st
                    .terminals
                    .iter()
                    .any(|&t| !joined.get(t as usize).copied().unwrap_or(false))
            {
                unjoined = Some(m);
            }
            st.capture = None;
            st.terminals.clear();
        }
        if cap.status != CaptureStatus::Active {
            return Err(err(
                CALL,
                codes::STREAM_CAPTURE_INVALIDATED,
                format!(
                    "capture {id} was invalidated: {}",
                    cap.reason.as_deref().unwrap_or("unknown reason")
                ),
            ));
        }
        if let Some(m) = unjoined {
            return Err(err(
                CALL,
                codes::STREAM_CAPTURE_UNJOINED,
                format!("stream{m} forked into capture {id} and was not joined back into {s}"),
            ));
        }
        let data = Arc::new(GraphData {
            capture_id: id,
            nodes: cap.nodes,
        });
        self.graphs.retain(|_, w| w.strong_count() > 0);
        self.graphs.insert(id, Arc::downgrade(&data));
        Ok(MockGraph { data })
    }
}

impl GraphCapture<MockStream> for MockBackend {
    type Node = MockNode;

    fn capture_state(
        &self,
        stream: MockStream,
        terminals: &mut Vec<MockNode>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        self.call(MockCall::CaptureState, |st| {
            st.capture_state(stream, terminals)
        })
    }

    fn node_index(&self, capture: u64, node: MockNode) -> Option<u32> {
        (self.node_numbers && node.capture == capture).then_some(node.index)
    }

    fn mark_ancestors(
        &self,
        capture: u64,
        from: &[MockNode],
        visited: &mut Vec<u64>,
    ) -> Result<bool, BackendError> {
        let numbered = self.node_numbers;
        self.call(MockCall::MarkAncestors, |st| {
            if !numbered {
                return Ok(false);
            }
            Ok(match st.mark_ancestors(capture, from, visited) {
                Some(expanded) => {
                    st.counters.node_dependencies += expanded;
                    true
                }
                None => false,
            })
        })
    }

    fn extend_node_dependencies(
        &self,
        node: MockNode,
        out: &mut Vec<MockNode>,
    ) -> Result<(), BackendError> {
        self.call(MockCall::ExtendNodeDependencies, |st| {
            st.extend_node_dependencies(node, out)
        })
    }

    fn add_empty_node(
        &self,
        stream: MockStream,
        deps: &[MockNode],
    ) -> Result<MockNode, BackendError> {
        self.call(MockCall::AddEmptyNode, |st| st.add_empty_node(stream, deps))
    }

    fn update_capture_dependencies(
        &self,
        stream: MockStream,
        nodes: &[MockNode],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        self.call(MockCall::UpdateCaptureDependencies, |st| {
            st.update_capture_dependencies(stream, nodes, mode)
        })
    }
}
