use cachalot_conformance::mock::Dev;
use cachalot_core::Backend;
use cachalot_core::replay::{Trace, replay_pass};
use cachalot_mock::MockCall;

#[test]
fn scratch() {
    let trace = Trace::load(cachalot_conformance::traces_dir().join("gpt2_train.trace")).unwrap();
    let d = Dev::new("expandable_segments:True");
    let mut streams = vec![d.m.default_stream()];
    for _ in 1..trace.num_streams {
        streams.push(d.stream());
    }
    let mut ptr = vec![0u64; trace.num_ids];
    let calls = [
        MockCall::Map,
        MockCall::Unmap,
        MockCall::CreatePhysical,
        MockCall::ReleasePhysical,
        MockCall::SetAccess,
        MockCall::QueryStream,
        MockCall::RecordEvent,
    ];
    for pass in 0..6 {
        let c0: Vec<u64> = calls.iter().map(|c| d.m.call_count(*c)).collect();
        replay_pass(&d.a, &streams, &trace, &mut ptr).unwrap();
        let c1: Vec<u64> = calls.iter().map(|c| d.m.call_count(*c)).collect();
        let s = d.a.stats();
        eprintln!(
            "pass {pass}: {:?} reserved peak {} cur {} alloc peak {}",
            c0.iter().zip(&c1).map(|(a, b)| b - a).collect::<Vec<_>>(),
            s.reserved_bytes.all().peak,
            s.reserved_bytes.all().current,
            s.allocated_bytes.all().peak
        );
    }
}
