//! The simulated device's memory: `malloc`/`free` segments and virtual
//! memory (reservations, physical allocations, mappings, access).

use super::*;

impl State {
    // ----- memory --------------------------------------------------------

    pub(super) fn malloc(&mut self, size: u64) -> Result<u64, DeviceAllocError> {
        if size == 0 || !size.is_multiple_of(512) {
            return Err(DeviceAllocError::Backend(err(
                "malloc",
                codes::INVALID_VALUE,
                format!("size {size} is not a positive multiple of 512 bytes"),
            )));
        }
        if size > self.capacity.saturating_sub(self.used()) {
            return Err(DeviceAllocError::OutOfMemory);
        }
        let addr = self
            .space
            .allocate(size)
            .ok_or(DeviceAllocError::OutOfMemory)?;
        self.segments.insert(addr, size);
        self.live += size;
        Ok(addr)
    }

    pub(super) fn free(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        match self.segments.get(&addr) {
            None => {
                let inside = self
                    .segments
                    .range(..addr)
                    .next_back()
                    .is_some_and(|(&s, &sz)| addr < s + sz);
                let what = if inside {
                    "points inside a segment, not at its start"
                } else {
                    "was not allocated by this mock device (or was already freed)"
                };
                return Err(err(
                    "free",
                    codes::INVALID_DEVICE_POINTER,
                    format!("pointer {addr:#x} {what}"),
                ));
            }
            Some(&sz) if sz != size => {
                return Err(err(
                    "free",
                    codes::INVALID_VALUE,
                    format!("segment {addr:#x} has {sz} bytes but was freed with size {size}"),
                ));
            }
            Some(_) => {}
        }
        crate::ipc::forget("free", self.instance, (false, addr))?;
        self.segments.remove(&addr);
        self.live -= size;
        self.space.release(addr, size);
        // cudaFree synchronises implicitly: uses of the old segment are over.
        self.shadow.remove_range(addr, addr + size);
        self.data.clear(addr, addr + size);
        Ok(())
    }

    // ----- virtual memory --------------------------------------------------

    pub(super) fn vmm_enabled(&self, call: &'static str) -> Result<(), BackendError> {
        if self.vmm_on {
            Ok(())
        } else {
            Err(err(
                call,
                codes::NOT_SUPPORTED,
                "this mock device is configured without virtual memory",
            ))
        }
    }

    pub(super) fn reserve(&mut self, size: u64) -> Result<u64, DeviceAllocError> {
        const CALL: &str = "reserve";
        self.vmm_enabled(CALL)?;
        self.vmm.check_size(CALL, size)?;
        let addr = self.vmm.place(size).ok_or(DeviceAllocError::OutOfMemory)?;
        self.vmm.reservations.insert(addr, size);
        Ok(addr)
    }

    pub(super) fn unreserve(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        const CALL: &str = "unreserve";
        self.vmm_enabled(CALL)?;
        match self.vmm.reservations.get(&addr) {
            None => {
                return Err(err(
                    CALL,
                    codes::INVALID_DEVICE_POINTER,
                    format!("{addr:#x} is not the start of a reservation of this mock device"),
                ));
            }
            Some(&sz) if sz != size => {
                return Err(err(
                    CALL,
                    codes::INVALID_VALUE,
                    format!("reservation {addr:#x} has {sz} bytes but was unreserved with {size}"),
                ));
            }
            Some(_) => {}
        }
        let end = addr + size;
        if let Some((&s, m)) = self.vmm.mappings.range(addr..end).next() {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!(
                    "reservation [{addr:#x}, {end:#x}) still has [{s:#x}, {:#x}) mapped",
                    s + m.size
                ),
            ));
        }
        self.vmm.reservations.remove(&addr);
        Ok(())
    }

    pub(super) fn create_physical(&mut self, size: u64) -> Result<MockPhysical, DeviceAllocError> {
        const CALL: &str = "create_physical";
        self.vmm_enabled(CALL)?;
        self.vmm.check_size(CALL, size)?;
        if size > self.capacity.saturating_sub(self.used()) {
            return Err(DeviceAllocError::OutOfMemory);
        }
        let id = self.vmm.next_physical;
        self.vmm.next_physical += 1;
        self.vmm.physical.insert(
            id,
            Phys {
                size,
                maps: 0,
                data: TagMap::default(),
                last_use: Vec::new(),
            },
        );
        self.vmm.physical_bytes += size;
        Ok(MockPhysical {
            instance: self.instance,
            id,
            size,
        })
    }

    pub(super) fn release_physical(&mut self, p: &MockPhysical) -> Result<(), BackendError> {
        const CALL: &str = "release_physical";
        self.vmm_enabled(CALL)?;
        let ph = self.vmm.phys(CALL, self.instance, p)?;
        if ph.maps > 0 {
            return Err(err(
                CALL,
                codes::ILLEGAL_STATE,
                format!(
                    "physical allocation {} is still mapped ({} mapping(s)); unmap it first",
                    p.id, ph.maps
                ),
            ));
        }
        let size = ph.size;
        crate::ipc::forget(CALL, self.instance, (true, p.id))?;
        self.vmm.physical.remove(&p.id);
        self.vmm.physical_bytes -= size;
        Ok(())
    }

    pub(super) fn map(
        &mut self,
        addr: u64,
        size: u64,
        p: &MockPhysical,
    ) -> Result<(), BackendError> {
        const CALL: &str = "map";
        self.vmm_enabled(CALL)?;
        let ph = self.vmm.phys(CALL, self.instance, p)?;
        if ph.size != size {
            return Err(err(
                CALL,
                codes::INVALID_VALUE,
                format!(
                    "physical allocation {} has {} bytes but was mapped with size {size}",
                    p.id, ph.size
                ),
            ));
        }
        let end = self.vmm.aligned(CALL, addr, size)?;
        self.vmm.reserved(CALL, addr, end)?;
        if let Some(q) = self
            .vmm
            .pieces(addr, end)
            .iter()
            .find(|q| q.mapping.is_some())
        {
            return Err(err(
                CALL,
                codes::ALREADY_MAPPED,
                format!("[{:#x}, {:#x}) is already mapped", q.lo, q.hi),
            ));
        }
        self.vmm.mappings.insert(
            addr,
            Mapping {
                size,
                phys: p.id,
                access: false,
                last_use: Vec::new(),
            },
        );
        if let Some(ph) = self.vmm.physical.get_mut(&p.id) {
            ph.maps += 1;
        }
        Ok(())
    }

    pub(super) fn unmap(&mut self, addr: u64, size: u64) -> Result<(), BackendError> {
        const CALL: &str = "unmap";
        self.vmm_enabled(CALL)?;
        let starts = self.vmm.whole_mappings(CALL, addr, size)?;
        if starts.len() > 1 {
            return Err(err(
                CALL,
                codes::INVALID_VALUE,
                format!(
                    "[{addr:#x}, {:#x}) spans {} mappings; unmap one mapping per call \
                     (cuMemUnmap takes the whole range of one mapping)",
                    addr + size,
                    starts.len()
                ),
            ));
        }
        for &s in &starts {
            let m = &self.vmm.mappings[&s];
            let pending = m
                .last_use
                .iter()
                .enumerate()
                .find(|&(j, &pos)| self.streams.get(j).is_some_and(|st| pos > st.completed));
            if let Some((j, &pos)) = pending {
                self.counters.unmap_refused += 1;
                return Err(err(
                    CALL,
                    codes::NOT_READY,
                    format!(
                        "work #{pos} on stream{j}, not yet complete, touches the mapping \
                         [{s:#x}, {:#x}); synchronize before unmapping",
                        s + m.size
                    ),
                ));
            }
        }
        for s in starts {
            if let Some(m) = self.vmm.mappings.remove(&s)
                && let Some(ph) = self.vmm.physical.get_mut(&m.phys)
            {
                ph.maps -= 1;
            }
        }
        // Every use of the range has completed (checked above).
        self.shadow.remove_range(addr, addr + size);
        Ok(())
    }

    pub(super) fn set_access(
        &mut self,
        addr: u64,
        size: u64,
        device: DeviceIndex,
    ) -> Result<(), BackendError> {
        const CALL: &str = "set_access";
        self.vmm_enabled(CALL)?;
        if device != self.device {
            return Err(err(
                CALL,
                codes::INVALID_DEVICE,
                format!(
                    "device {device} is not this mock device ({}); the mock has no peers",
                    self.device
                ),
            ));
        }
        for s in self.vmm.whole_mappings(CALL, addr, size)? {
            if let Some(m) = self.vmm.mappings.get_mut(&s) {
                m.access = true;
            }
        }
        Ok(())
    }
}

/// Simulated virtual memory; see the [crate documentation](crate) for the
/// model and the errors of each misuse.
impl VirtualMemory for MockBackend {
    type Physical = MockPhysical;

    fn granularity(&self) -> Result<u64, BackendError> {
        self.call(MockCall::Granularity, |st| {
            st.vmm_enabled("granularity")?;
            Ok(st.vmm.granularity)
        })
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceAllocError> {
        self.alloc_call(MockCall::Reserve, |st| st.reserve(size))
    }

    fn unreserve(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.call(MockCall::Unreserve, |st| st.unreserve(addr, size))
    }

    fn create_physical(&self, size: u64) -> Result<MockPhysical, DeviceAllocError> {
        self.alloc_call(MockCall::CreatePhysical, |st| st.create_physical(size))
    }

    fn release_physical(&self, physical: MockPhysical) -> Result<(), BackendError> {
        self.call(MockCall::ReleasePhysical, |st| {
            st.release_physical(&physical)
        })
    }

    fn map(&self, addr: u64, size: u64, physical: &MockPhysical) -> Result<(), BackendError> {
        self.call(MockCall::Map, |st| st.map(addr, size, physical))
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        self.call(MockCall::Unmap, |st| st.unmap(addr, size))
    }

    fn set_access(&self, addr: u64, size: u64, device: DeviceIndex) -> Result<(), BackendError> {
        self.call(MockCall::SetAccess, |st| st.set_access(addr, size, device))
    }

    fn export_physical(&self, physical: &MockPhysical) -> Result<Option<i32>, BackendError> {
        let (instance, size) = {
            let st = self.inner.lock();
            st.vmm_enabled("export_physical")?;
            let ph = st.vmm.phys("export_physical", st.instance, physical)?;
            (st.instance, ph.size)
        };
        crate::ipc::export_physical(instance, physical.id, size).map(Some)
    }
}
