//! scratch
use cachalot_core::*;
use parking_lot::Mutex;
struct Bump {
    next: Mutex<(u64, std::collections::BTreeMap<u64, u64>)>,
}
impl Backend for Bump {
    type Stream = u32;
    type Event = ();
    type Ptr = u64;
    type Node = ();
    fn name(&self) -> &'static str {
        "bump"
    }
    fn device(&self) -> u32 {
        0
    }
    fn default_stream(&self) -> u32 {
        0
    }
    fn malloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let mut g = self.next.lock();
        // lowest-address first fit with 2MiB alignment
        let mut at = 1u64 << 40;
        for (&a, &s) in g.1.iter() {
            if a >= at + size {
                break;
            }
            at = at.max((a + s).div_ceil(2 << 20) * (2 << 20));
        }
        g.1.insert(at, size);
        Ok(at)
    }
    fn free(&self, p: u64, _s: u64) -> Result<(), BackendError> {
        self.next.lock().1.remove(&p);
        Ok(())
    }
    fn memory_info(&self) -> Result<MemoryInfo, BackendError> {
        Ok(MemoryInfo {
            free: 140 << 30,
            total: 150754820096,
        })
    }
    fn create_event(&self) -> Result<(), BackendError> {
        Ok(())
    }
    fn destroy_event(&self, _e: ()) -> Result<(), BackendError> {
        Ok(())
    }
    fn record_event(&self, _e: &(), _s: u32) -> Result<(), BackendError> {
        Ok(())
    }
    fn query_event(&self, _e: &()) -> Result<bool, BackendError> {
        Ok(true)
    }
    fn synchronize_event(&self, _e: &()) -> Result<(), BackendError> {
        Ok(())
    }
    fn stream_wait_event(&self, _s: u32, _e: &()) -> Result<(), BackendError> {
        Ok(())
    }
    fn synchronize_device(&self) -> Result<(), BackendError> {
        Ok(())
    }
}
fn main() {
    let a = CachingAllocator::with_config(
        Bump {
            next: Mutex::new((0, Default::default())),
        },
        AllocatorConfig::default(),
    )
    .unwrap();
    let streams: Vec<u32> = (0..16).collect();
    for name in std::env::args().skip(1) {
        let t = replay::Trace::synthetic(&name)
            .map(Ok)
            .unwrap_or_else(|| replay::Trace::load(&name))
            .unwrap();
        let r = replay::replay(
            &a,
            &streams,
            &t,
            std::env::var("P").map(|p| p.parse().unwrap()).unwrap_or(3),
            |_| {},
        )
        .unwrap();
        a.check_invariants().unwrap();
        println!("{}", r.to_json());
    }
}
