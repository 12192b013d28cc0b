//! Hostile environment variables (issue 17), through the real process
//! environment. The environment is process-global: this binary holds one
//! test, which sets the variables in order.

use cachalot::{
    BACKEND_ENV, BackendKind, Error, MAX_MOCK_MEMORY, MOCK_DEVICES_ENV, MOCK_MEMORY_ENV,
};

fn set(var: &str, value: impl AsRef<std::ffi::OsStr>) {
    // SAFETY: the only test of this binary, so no other thread reads or
    // writes the environment meanwhile.
    unsafe { std::env::set_var(var, value) };
}

fn unset(var: &str) {
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var(var) };
}

fn assert_invalid_env(r: Result<(), Error>, var: &str, value: &str) {
    match r {
        Err(Error::InvalidEnv {
            var: v,
            value: got,
            allowed,
        }) => {
            assert_eq!(v, var);
            assert_eq!(got, value);
            assert!(allowed.starts_with("an integer in [0, "), "{allowed}");
        }
        other => panic!("{var}={value}: {other:?}"),
    }
}

#[test]
fn hostile_environment_is_a_typed_error() {
    for v in [
        "CACHALOT_ALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_HIP_ALLOC_CONF",
    ] {
        unset(v);
    }
    unset("PYTORCH_ALLOC_CONF");
    unset(BACKEND_ENV);
    // once aborted the process allocating 2^32 device slots
    set(MOCK_DEVICES_ENV, "4294967295");
    assert_invalid_env(
        cachalot::init(BackendKind::Mock),
        MOCK_DEVICES_ENV,
        "4294967295",
    );
    set(MOCK_DEVICES_ENV, "65");
    assert_invalid_env(cachalot::init(BackendKind::Mock), MOCK_DEVICES_ENV, "65");
    set(MOCK_DEVICES_ENV, "2");
    // once drove reserved_bytes.all.current negative (i64 stats, u64 capacity)
    for v in [
        "18446744073709551615",
        "9223372036854775808",
        "4398046511105",
    ] {
        set(MOCK_MEMORY_ENV, v);
        assert_invalid_env(cachalot::init(BackendKind::Mock), MOCK_MEMORY_ENV, v);
    }
    set(MOCK_MEMORY_ENV, MAX_MOCK_MEMORY.to_string());
    cachalot::init(BackendKind::Mock).unwrap();

    // the allocator config variables go through the bounded parser
    set(
        "CACHALOT_ALLOC_CONF",
        "roundup_power2_divisions:9223372036854775808",
    );
    match cachalot::allocator(Some(0)) {
        Err(Error::Config(e)) => {
            assert_eq!(e.env_var, Some("CACHALOT_ALLOC_CONF"));
            assert_eq!(e.key, "roundup_power2_divisions");
            assert!(e.to_string().contains("9223372036854775808"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    set("CACHALOT_ALLOC_CONF", "x".repeat(1 << 20));
    match cachalot::allocator(Some(0)) {
        Err(Error::Config(e)) => assert!(e.to_string().len() < 300, "echoed whole"),
        other => panic!("{other:?}"),
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        set(
            "CACHALOT_ALLOC_CONF",
            std::ffi::OsStr::from_bytes(b"expandable_segments:\xff"),
        );
        match cachalot::allocator(Some(0)) {
            Err(Error::Config(e)) => assert_eq!(e.env_var, Some("CACHALOT_ALLOC_CONF")),
            other => panic!("{other:?}"),
        }
        set(BACKEND_ENV, std::ffi::OsStr::from_bytes(b"mo\xffck"));
        assert!(matches!(
            BackendKind::detect(),
            Err(Error::InvalidEnv {
                var: BACKEND_ENV,
                ..
            })
        ));
        unset(BACKEND_ENV);
    }
    set(BACKEND_ENV, "t".repeat(100_000));
    let e = BackendKind::detect().unwrap_err();
    assert!(e.to_string().len() < 300, "echoed whole");
    unset(BACKEND_ENV);
    unset("CACHALOT_ALLOC_CONF");

    // the largest capacity allowed keeps the stats non-negative when full
    let a = cachalot::allocator(Some(1)).unwrap();
    let s = a.default_stream();
    let mut live = Vec::new();
    for _ in 0..3 {
        match a.raw_alloc(MAX_MOCK_MEMORY / 4, s) {
            Ok(p) => live.push(p),
            Err(e) => panic!("{e}"),
        }
    }
    let stats = a.memory_stats();
    assert!(stats["reserved_bytes.all.current"] >= 3 * (MAX_MOCK_MEMORY as i64 / 4));
    // every stat but max_split_size (-1: unlimited) counts something
    assert!(
        stats
            .iter()
            .all(|(k, v)| *v >= 0 || (k == "max_split_size" && *v == -1)),
        "{stats:?}"
    );
    for p in live {
        a.raw_free(p).unwrap();
    }
}
