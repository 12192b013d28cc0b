//! Events: record, query, synchronize, and streams waiting on them.

use super::*;

impl State {
    // ----- events --------------------------------------------------------

    pub(super) fn create_event(&mut self) -> Result<MockEvent, BackendError> {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, EventRecord::Never);
        Ok(MockEvent {
            instance: self.instance,
            id,
        })
    }

    pub(super) fn destroy_event(&mut self, e: &MockEvent) -> Result<(), BackendError> {
        self.event("destroy_event", e)?;
        self.events.remove(&e.id);
        Ok(())
    }

    pub(super) fn record_event(
        &mut self,
        e: &MockEvent,
        s: MockStream,
    ) -> Result<(), BackendError> {
        self.event("record_event", e)?;
        let i = self.stream_idx("record_event", s)?;
        let rec = match self.active_capture("record_event", i)? {
            Some(capture) => EventRecord::Captured {
                capture,
                nodes: self.streams[i].terminals.clone(),
            },
            None => {
                let st = &self.streams[i];
                let mut clock = st.clock.clone();
                if clock.len() <= i {
                    clock.resize(i + 1, 0);
                }
                clock[i] = st.submitted;
                EventRecord::Work {
                    stream: i,
                    pos: st.submitted,
                    clock,
                }
            }
        };
        self.events.insert(e.id, rec);
        Ok(())
    }

    /// Common checks of `query_event`/`synchronize_event`; returns the
    /// `(stream, position)` the event waits for, if any.
    pub(super) fn observable_event(
        &mut self,
        call: &'static str,
        e: &MockEvent,
    ) -> Result<Option<(usize, u64)>, BackendError> {
        let target = match self.event(call, e)? {
            EventRecord::Captured { capture, .. } => Err(*capture),
            EventRecord::Never => Ok(None),
            EventRecord::Work { stream, pos, .. } => Ok(Some((*stream, *pos))),
        };
        match target {
            Err(capture) => {
                self.invalidate(
                    capture,
                    format!("{call} on an event recorded during capture"),
                );
                Err(err(
                    call,
                    codes::CAPTURED_EVENT,
                    format!(
                        "event {} was last recorded in capture {capture}; it stands for no work",
                        e.id
                    ),
                ))
            }
            Ok(t) => {
                if self.capture_mode == CaptureMode::Global && self.any_capture_active() {
                    let reason =
                        format!("{call} while a capture is underway (global capture mode)");
                    self.invalidate_all(&reason);
                    return Err(err(call, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
                }
                Ok(t)
            }
        }
    }

    pub(super) fn query_event(&mut self, e: &MockEvent) -> Result<bool, BackendError> {
        Ok(match self.observable_event("query_event", e)? {
            None => true,
            Some((s, p)) => self.streams[s].completed >= p,
        })
    }

    /// Whether all work submitted to `s` has completed. As CUDA's
    /// `cuStreamQuery`: prohibited on a capturing stream (the capture is
    /// invalidated) and, in the global capture mode, while any capture is
    /// underway (every capture is invalidated).
    pub(super) fn query_stream(&mut self, s: MockStream) -> Result<bool, BackendError> {
        const CALL: &str = "query_stream";
        let i = self.stream_idx(CALL, s)?;
        if let Some(id) = self.active_capture(CALL, i)? {
            let reason = format!("{CALL} on capturing stream{i}");
            self.invalidate(id, reason.clone());
            return Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
        }
        if self.capture_mode == CaptureMode::Global && self.any_capture_active() {
            let reason = format!("{CALL} while a capture is underway (global capture mode)");
            self.invalidate_all(&reason);
            return Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason));
        }
        let st = &self.streams[i];
        Ok(st.completed >= st.submitted)
    }

    pub(super) fn synchronize_event(&mut self, e: &MockEvent) -> Result<(), BackendError> {
        if let Some((s, p)) = self.observable_event("synchronize_event", e)? {
            self.complete_to(s, p);
        }
        Ok(())
    }

    pub(super) fn stream_wait_event(
        &mut self,
        s: MockStream,
        e: &MockEvent,
    ) -> Result<(), BackendError> {
        const CALL: &str = "stream_wait_event";
        let rec = self.event(CALL, e)?.clone();
        let i = self.stream_idx(CALL, s)?;
        let mine = self.active_capture(CALL, i)?;
        match rec {
            EventRecord::Never => Ok(()),
            EventRecord::Work { clock, .. } => {
                if let Some(id) = mine {
                    self.invalidate(id, "a capturing stream waited on an uncaptured event");
                    return Err(err(
                        CALL,
                        codes::STREAM_CAPTURE_ISOLATION,
                        format!(
                            "{s} is capturing and event {} was recorded outside capture",
                            e.id
                        ),
                    ));
                }
                let st = &mut self.streams[i];
                if st.clock.len() < clock.len() {
                    st.clock.resize(clock.len(), 0);
                }
                for (c, q) in st.clock.iter_mut().zip(clock) {
                    *c = (*c).max(q);
                }
                let first = st.submitted + 1;
                match st.epochs.back_mut() {
                    Some((f, c)) if *f == first => c.clone_from(&st.clock),
                    _ => st.epochs.push_back((first, st.clock.clone())),
                }
                Ok(())
            }
            EventRecord::Captured { capture, nodes } => {
                let status = self.captures.get(&capture).map(|c| c.status);
                match status {
                    None => Err(err(
                        CALL,
                        codes::CAPTURED_EVENT,
                        format!(
                            "event {} was recorded in capture {capture}, which has ended",
                            e.id
                        ),
                    )),
                    Some(CaptureStatus::Active) => match mine {
                        Some(id) if id == capture => {
                            push_unique(&mut self.streams[i].terminals, nodes);
                            Ok(())
                        }
                        Some(id) => {
                            let reason = format!("captures {id} and {capture} would merge");
                            self.invalidate(id, reason.clone());
                            self.invalidate(capture, reason.clone());
                            Err(err(CALL, codes::STREAM_CAPTURE_MERGE, reason))
                        }
                        None if i == 0 => {
                            let reason = "the legacy default stream cannot join a capture";
                            self.invalidate(capture, reason);
                            Err(err(CALL, codes::STREAM_CAPTURE_UNSUPPORTED, reason))
                        }
                        None => {
                            let st = &mut self.streams[i];
                            st.capture = Some(capture);
                            st.terminals.clear();
                            push_unique(&mut st.terminals, nodes);
                            if let Some(c) = self.captures.get_mut(&capture) {
                                c.members.insert(i);
                            }
                            Ok(())
                        }
                    },
                    Some(_) => Err(err(
                        CALL,
                        codes::STREAM_CAPTURE_INVALIDATED,
                        format!("event {} belongs to invalidated capture {capture}", e.id),
                    )),
                }
            }
        }
    }

    pub(super) fn synchronize_device(&mut self) -> Result<(), BackendError> {
        if !self.captures.is_empty() {
            let reason = "synchronize_device while a capture is underway";
            self.invalidate_all(reason);
            return Err(err(
                "synchronize_device",
                codes::STREAM_CAPTURE_UNSUPPORTED,
                reason,
            ));
        }
        self.complete_all();
        Ok(())
    }
}
