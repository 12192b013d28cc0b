//! The replay's hostile-input rules on the simulated device: streams are
//! never folded onto each other, and a failing operation is named by its
//! line and text.

use cachalot_core::replay::{Op, Trace, replay, threads_bench};
use cachalot_core::{Backend, CachingAllocator, Error};
use cachalot_mock::{MockBackend, MockConfig};

fn mock() -> MockBackend {
    MockConfig::new(1 << 34).auto_complete(true).build()
}

#[test]
fn replay_never_folds_streams() {
    let m = mock();
    let s0 = m.default_stream();
    let s1 = m.create_stream();
    let a = CachingAllocator::new(m).unwrap();
    let t = Trace::parse("t", "a 0 512 0\na 1 512 5\nf 0\n").unwrap();
    let e = replay(&a, &[s0], &t, 1, |_| {}).unwrap_err();
    assert!(matches!(*e.source, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("uses 2 streams"), "{e}");
    let e = replay(&a, &[], &t, 1, |_| {}).unwrap_err();
    assert!(matches!(*e.source, Error::InvalidArgument(_)), "{e}");
    let r = replay(&a, &[s0, s1], &t, 2, |_| {}).unwrap();
    assert_eq!(r.ops, 3);
    // a hand-built trace naming an id or stream beyond its tables
    let mut bad = t.clone();
    bad.ops.push(Op::Alloc {
        id: 9,
        size: 1,
        stream: 0,
    });
    let e = replay(&a, &[s0, s1], &bad, 1, |_| {}).unwrap_err();
    assert_eq!(e.op_index, Some(3), "{e}");
    bad.ops[3] = Op::Alloc {
        id: 0,
        size: 1,
        stream: 2,
    };
    let e = replay(&a, &[s0, s1], &bad, 1, |_| {}).unwrap_err();
    assert_eq!(e.op_index, Some(3), "{e}");
    a.check_invariants().unwrap();
}

#[test]
fn replay_error_names_the_line_and_operation() {
    let m = mock();
    let s = m.default_stream();
    let a = CachingAllocator::new(m).unwrap();
    let t = Trace::parse(
        "x.trace",
        "# c\na 9 512 0\na 4000000000 18446744073709551615 0\n",
    )
    .unwrap();
    let e = replay(&a, &[s], &t, 1, |_| {}).unwrap_err();
    assert_eq!((e.op_index, e.line), (Some(1), Some(3)));
    assert_eq!(e.op.as_deref(), Some("a 4000000000 18446744073709551615 0"));
    assert!(matches!(*e.source, Error::NeverFits { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("x.trace:3: 'a 4000000000 18446744073709551615 0': "),
        "{msg}"
    );
}

#[test]
fn threads_bench_without_streams_is_an_error() {
    let a = CachingAllocator::new(mock()).unwrap();
    assert!(matches!(
        threads_bench(&a, &[], 10),
        Err(Error::InvalidArgument(_))
    ));
}
