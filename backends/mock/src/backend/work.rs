//! Work on streams and its completion, and the calls with their injected
//! failures.

use super::*;

impl State {
    // ----- work and completion ------------------------------------------

    /// Completes stream `s` up to position `p` and, first, everything that
    /// work depends on (cascading through stream waits).
    pub(super) fn complete_to(&mut self, s: usize, p: u64) {
        let mut todo = vec![(s, p)];
        while let Some((s, p)) = todo.pop() {
            let Some(st) = self.streams.get_mut(s) else {
                continue;
            };
            let p = p.min(st.submitted);
            if st.completed >= p {
                continue;
            }
            if let Some((_, clock)) = st.epochs.iter().rev().find(|(f, _)| *f <= p) {
                for (j, &q) in clock.iter().enumerate() {
                    if j != s && q > 0 {
                        todo.push((j, q));
                    }
                }
            }
            st.completed = p;
            while st.epochs.len() > 1 && st.epochs[1].0 <= st.completed + 1 {
                st.epochs.pop_front();
            }
        }
    }

    /// Advances the operation clock by one and completes the late work that
    /// is due ([`Completion::Random`]).
    pub(super) fn tick(&mut self) {
        self.now += 1;
        if self.now >= self.next_due {
            self.complete_due();
        }
    }

    pub(super) fn complete_due(&mut self) {
        let now = self.now;
        let mut next = u64::MAX;
        for i in 0..self.streams.len() {
            let st = &mut self.streams[i];
            let mut upto = 0;
            while let Some(&(pos, due)) = st.due.front() {
                if pos > st.completed && due > now {
                    break;
                }
                if pos > st.completed {
                    upto = pos;
                }
                st.due.pop_front();
            }
            if upto > 0 {
                self.complete_to(i, upto);
            }
            if let Some(&(_, due)) = self.streams[i].due.front() {
                next = next.min(due);
            }
        }
        self.next_due = next;
    }

    /// Sets the completion mode; pending late work stays pending.
    pub(super) fn set_completion(&mut self, completion: Completion) {
        self.completion = completion;
        self.rng = SplitMix64::new(seed_of(completion));
        for st in &mut self.streams {
            st.due.clear();
        }
        self.next_due = u64::MAX;
        if completion == Completion::Immediate {
            self.complete_all();
        }
    }

    // ----- calls and injected failures ------------------------------------

    /// Counts one call of `call` (clock, per-kind and [`MockCounters`]) and
    /// returns the failure to inject into it, if any.
    pub(super) fn enter(&mut self, call: MockCall) -> Option<Failure> {
        self.tick();
        let c = &mut self.counters;
        let capturing = !self.captures.is_empty();
        match call {
            MockCall::Malloc => {
                c.malloc += 1;
                c.malloc_during_capture += u64::from(capturing);
            }
            MockCall::Free => {
                c.free += 1;
                c.free_during_capture += u64::from(capturing);
            }
            MockCall::MemoryInfo => c.memory_info += 1,
            MockCall::CreateEvent => c.create_event += 1,
            MockCall::DestroyEvent => c.destroy_event += 1,
            MockCall::RecordEvent => c.record_event += 1,
            MockCall::QueryEvent => c.query_event += 1,
            MockCall::QueryStream => c.query_stream += 1,
            MockCall::SynchronizeEvent => c.synchronize_event += 1,
            MockCall::StreamWaitEvent => c.stream_wait_event += 1,
            MockCall::SynchronizeDevice => c.synchronize_device += 1,
            MockCall::CaptureState => c.capture_info += 1,
            MockCall::ExtendNodeDependencies => c.node_dependencies += 1,
            MockCall::MarkAncestors => {}
            MockCall::AddEmptyNode => c.add_empty_node += 1,
            MockCall::UpdateCaptureDependencies => c.update_capture_dependencies += 1,
            MockCall::Granularity => c.granularity += 1,
            MockCall::Reserve => c.reserve += 1,
            MockCall::Unreserve => c.unreserve += 1,
            MockCall::CreatePhysical => c.create_physical += 1,
            MockCall::ReleasePhysical => c.release_physical += 1,
            MockCall::Map => c.map += 1,
            MockCall::Unmap => c.unmap += 1,
            MockCall::SetAccess => c.set_access += 1,
        }
        let k = call.index();
        self.calls[k] += 1;
        let f = self.failures[k].remove(&self.calls[k]).or(self.always[k]);
        if f.is_some() {
            self.counters.injected += 1;
        }
        f
    }

    /// Counts a failed call of `call` (any reason).
    pub(super) fn failed(&mut self, call: MockCall) {
        let c = &mut self.counters;
        c.errors += 1;
        match call {
            MockCall::Malloc => c.malloc_failed += 1,
            MockCall::Free => c.free_failed += 1,
            MockCall::CreateEvent => c.create_event_failed += 1,
            MockCall::Reserve => c.reserve_failed += 1,
            MockCall::CreatePhysical => c.create_physical_failed += 1,
            _ => {}
        }
    }

    /// The error an injected `failure` of the current `call` returns.
    pub(super) fn injected_error(&self, call: MockCall, failure: Failure) -> BackendError {
        let code = match failure {
            Failure::Backend(code) => code,
            Failure::OutOfMemory => codes::MEMORY_ALLOCATION,
        };
        err(
            call.name(),
            code,
            format!(
                "injected failure of {call} call #{}",
                self.calls[call.index()]
            ),
        )
    }

    pub(super) fn complete_all(&mut self) {
        for i in 0..self.streams.len() {
            let p = self.streams[i].submitted;
            self.complete_to(i, p);
        }
    }

    pub(super) fn submit(
        &mut self,
        call: &'static str,
        i: usize,
        kind: NodeKind,
        uses: Vec<MemUse>,
    ) -> Result<Submitted, BackendError> {
        self.tick();
        self.counters.launches += 1;
        for u in &uses {
            self.check_use(call, u)?;
        }
        match self.active_capture(call, i)? {
            Some(id) => Ok(self.add_node(id, i, kind, uses)),
            None => Ok(self.submit_eager(i, &uses)),
        }
    }

    pub(super) fn submit_eager(&mut self, i: usize, uses: &[MemUse]) -> Submitted {
        let st = &mut self.streams[i];
        st.submitted += 1;
        let pos = st.submitted;
        if self.race_checking {
            for u in uses {
                self.check_eager_use(i, pos, u);
            }
        }
        for u in uses {
            if self.in_segment(u.addr, u.addr + u.len) {
                self.data.write(u.addr, u.addr + u.len, u.tag);
            } else {
                self.touch_reserved(i, pos, u);
            }
        }
        match self.completion {
            Completion::Immediate => self.complete_to(i, pos),
            Completion::Manual => {}
            Completion::Random { max_delay_ops, .. } => {
                let d = self.rng.next_u64() % (u64::from(max_delay_ops) + 1);
                let st = &mut self.streams[i];
                let due = st
                    .due
                    .back()
                    .map_or(0, |&(_, last)| last)
                    .max(self.now + 1 + d);
                st.due.push_back((pos, due));
                self.next_due = self.next_due.min(due);
            }
        }
        Submitted::Work {
            stream: MockStream(i as u32),
            seq: pos,
        }
    }

    pub(super) fn check_eager_use(&mut self, b: usize, pos: u64, u: &MemUse) {
        let id = self.next_use;
        self.next_use += 1;
        let store = self.completion != Completion::Immediate;
        let new = Access {
            who: Who::Work {
                stream: b as u32,
                pos,
            },
            stream: b as u32,
            tag: u.tag,
            addr: u.addr,
            len: u.len,
            id,
        };
        let State {
            streams,
            shadow,
            races,
            ..
        } = self;
        let clock = &streams[b].clock;
        let mut reported: Vec<u64> = Vec::new();
        shadow.visit_insert(u.addr, u.addr + u.len, new, store, |x| {
            let Who::Work { stream: a, pos: pa } = x.who else {
                return true;
            };
            let a = a as usize;
            if streams.get(a).is_some_and(|s| s.completed >= pa) {
                return false;
            }
            let ordered = a == b || clock.get(a).copied().unwrap_or(0) >= pa;
            if ordered {
                // A later use with the same tag subsumes an ordered earlier one.
                return x.tag != u.tag;
            }
            if x.tag != u.tag && !reported.contains(&x.id) {
                reported.push(x.id);
                races.push(make_race(x, &new, None));
            }
            true
        });
        if store {
            self.shadow_inserts += 1;
            if self.shadow_inserts > 4096.max(2 * self.shadow.len()) {
                self.sweep();
            }
        }
    }

    pub(super) fn sweep(&mut self) {
        self.shadow_inserts = 0;
        let streams = &self.streams;
        self.shadow.sweep(|x| match x.who {
            Who::Work { stream, pos } => streams
                .get(stream as usize)
                .is_some_and(|s| s.completed < pos),
            Who::Node(_) => false,
        });
    }

    pub(super) fn add_node(
        &mut self,
        id: u64,
        i: usize,
        kind: NodeKind,
        uses: Vec<MemUse>,
    ) -> Submitted {
        let deps = std::mem::take(&mut self.streams[i].terminals);
        let Some(cap) = self.captures.get_mut(&id) else {
            return Submitted::Node(MockNode {
                capture: id,
                index: 0,
            });
        };
        let idx = cap.nodes.len() as u32;
        cap.nodes.push(GraphNode {
            kind,
            stream: Some(i as u32),
            deps,
            uses: uses.clone(),
        });
        self.streams[i].terminals = vec![idx];
        if self.race_checking {
            for u in &uses {
                let use_id = self.next_use;
                self.next_use += 1;
                check_capture_use(cap, id, idx, i, u, use_id, &mut self.races);
            }
        }
        Submitted::Node(MockNode {
            capture: id,
            index: idx,
        })
    }
}
