//! The IPC functions of the C ABI on two mock devices (each plays a
//! process): PyTorch's wire format out of `cachalot_ipc_share`, opened by
//! the other side with `cachalot_ipc_open` (counted per handle, unmapped
//! by the last `cachalot_ipc_close`), a segment open elsewhere never given
//! back to the device, and malformed handles as typed errors.

use std::ffi::c_void;
use std::ptr::null_mut;

use cachalot_capi::drop_in::cachalot_raw_delete;
use cachalot_capi::ipc::*;
use cachalot_capi::*;

mod common;
use common::*;

fn share(p: *mut c_void) -> Result<(Vec<u8>, u64), (i32, usize)> {
    let mut buf = [0u8; 256];
    let (mut len, mut off) = (0usize, 0u64);
    // SAFETY: a 256-byte buffer and two valid out-pointers.
    let rc = unsafe { cachalot_ipc_share(p, 0, buf.as_mut_ptr(), buf.len(), &mut len, &mut off) };
    if rc != CACHALOT_OK {
        return Err((rc, len));
    }
    Ok((buf[..len].to_vec(), off))
}

fn open(device: i32, h: &[u8]) -> Result<*mut c_void, i32> {
    let mut out = null_mut();
    // SAFETY: `h` is readable for its length; `out` is a valid out-pointer.
    let rc = unsafe { cachalot_ipc_open(device, h.as_ptr(), h.len(), &mut out) };
    if rc == CACHALOT_OK { Ok(out) } else { Err(rc) }
}

#[test]
fn share_open_close_on_two_processes() {
    // SAFETY: this test binary runs this one test, before any thread reads
    // the environment.
    unsafe { std::env::set_var("CACHALOT_MOCK_DEVICES", "2") };
    // SAFETY: NUL-terminated literals.
    unsafe {
        assert_eq!(cachalot_init(c"mock".as_ptr()), CACHALOT_OK);
        assert_eq!(
            cachalot_set_config(c"expandable_segments:False".as_ptr()),
            CACHALOT_OK
        );
    }
    cachalot_set_error_logging(0);

    // a fixed segment: 'c'
    let a = alloc(512, null_mut());
    let b = alloc(3000, null_mut());
    let (h, off) = share(b).unwrap();
    assert_eq!((h.len(), h[0], h[1]), (66, 2, b'c'));
    assert_eq!(
        off,
        b.addr() as u64 - a.addr() as u64,
        "offset in the segment"
    );
    assert!(matches!(decode(&h), Ok(Decoded::Segment(_))));
    let (h_a, off_a) = share(a).unwrap();
    assert_eq!((h_a, off_a), (h.clone(), 0), "one segment, one handle");
    let at = open(1, &h).unwrap();
    assert_eq!(open(1, &h).unwrap(), at, "opened once, counted twice");
    assert_eq!(open_handles(), 1);
    // the producer lets go while the consumer maps the segment: the
    // segment stays cached
    assert_eq!(cachalot_raw_delete(a, 0), CACHALOT_OK);
    assert_eq!(cachalot_raw_delete(b, 0), CACHALOT_OK);
    assert_ne!(cachalot_empty_cache(0), CACHALOT_OK);
    assert_eq!(cachalot_ipc_close(1, at), CACHALOT_OK);
    assert_ne!(cachalot_empty_cache(0), CACHALOT_OK, "one user left");
    assert_eq!(cachalot_ipc_close(1, at), CACHALOT_OK);
    assert_eq!(open_handles(), 0);
    assert_eq!(cachalot_ipc_close(1, at), CACHALOT_ERR_INVALID_ARGUMENT);
    assert_eq!(cachalot_empty_cache(0), CACHALOT_OK);

    // expandable pages: 'e' with this process's id and one descriptor per page
    // SAFETY: a NUL-terminated literal.
    let rc = unsafe { cachalot_set_config(c"expandable_segments:True,placement:pytorch".as_ptr()) };
    assert_eq!(rc, CACHALOT_OK);
    let c = alloc(4 << 20, null_mut());
    let (h, off) = share(c).unwrap();
    assert_eq!((h[0], h[1], off), (2, b'e', 0));
    let Ok(Decoded::Pages { pid, page, fds }) = decode(&h) else {
        panic!("{:?}", decode(&h))
    };
    assert_eq!(
        (pid as u32, page, fds.len()),
        (std::process::id(), 20 << 20, 1)
    );
    assert_eq!(h.len(), 2 + 24 + 4);
    let at = open(1, &h).unwrap();
    assert_eq!(cachalot_ipc_close(1, at), CACHALOT_OK);
    assert_eq!(cachalot_raw_delete(c, 0), CACHALOT_OK);

    // cachalot's page runs: a fresh 6 MiB block is a run of two 2 MiB
    // pages and a run of one, which 'e' cannot describe: 'r'
    // SAFETY: a NUL-terminated literal.
    let rc = unsafe { cachalot_set_config(c"expandable_segments:True,placement:steady".as_ptr()) };
    assert_eq!(rc, CACHALOT_OK);
    assert_eq!(cachalot_empty_cache(0), CACHALOT_OK);
    let r = alloc(6 << 20, null_mut());
    let (h, off) = share(r).unwrap();
    assert_eq!((h[0], h[1], off), (2, b'r', 0));
    let Ok(Decoded::Runs { pid, runs }) = decode(&h) else {
        panic!("{:?}", decode(&h))
    };
    assert_eq!(pid as u32, std::process::id());
    assert_eq!(
        runs.iter().map(|r| r.1).collect::<Vec<_>>(),
        [4 << 20, 2 << 20]
    );
    assert_eq!(h.len(), 2 + 16 + 16 * 2);
    let at = open(1, &h).unwrap();
    assert_eq!(open(1, &h).unwrap(), at, "opened once, counted twice");
    assert_eq!(cachalot_ipc_close(1, at), CACHALOT_OK);
    assert_eq!(cachalot_ipc_close(1, at), CACHALOT_OK);
    // a run announced with the wrong size: the device refuses it
    let mut wrong = h.clone();
    wrong[2 + 16 + 8..2 + 16 + 16].copy_from_slice(&(2u64 << 20).to_ne_bytes());
    assert_eq!(open(1, &wrong), Err(CACHALOT_ERR_BACKEND));
    assert_eq!(cachalot_raw_delete(r, 0), CACHALOT_OK);

    // errors
    assert!(matches!(
        share(0x1234 as *mut c_void),
        Err((CACHALOT_ERR_INVALID_POINTER, _))
    ));
    assert!(
        last_error().contains("invalid device pointer"),
        "{}",
        last_error()
    );
    let d = alloc(4096, null_mut());
    let mut tiny = [0u8; 4];
    let (mut len, mut off) = (0usize, 0u64);
    // SAFETY: a 4-byte buffer and two valid out-pointers.
    let rc = unsafe { cachalot_ipc_share(d, 0, tiny.as_mut_ptr(), 4, &mut len, &mut off) };
    assert_eq!((rc, len > 4), (CACHALOT_ERR_INVALID_ARGUMENT, true));
    // SAFETY: NULL out-pointers are reported, never written.
    let rc = unsafe { cachalot_ipc_share(d, 0, tiny.as_mut_ptr(), 4, null_mut(), &mut off) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert_eq!(cachalot_raw_delete(d, 0), CACHALOT_OK);
    assert!(decode(&[3, b'c']).unwrap_err().contains("future version"));
    assert!(decode(&[2]).is_err());
    assert!(decode(&[2, b'x', 0, 0]).unwrap_err().contains("ill-formed"));
    assert!(decode(&[2, b'c', 1, 2, 3]).is_err());
    let mut e = vec![2, b'e'];
    e.extend_from_slice(&1i32.to_ne_bytes());
    e.extend_from_slice(&[0; 4]);
    e.extend_from_slice(&(2u64 << 20).to_ne_bytes());
    e.extend_from_slice(&3u64.to_ne_bytes()); // three pages announced
    e.extend_from_slice(&5i32.to_ne_bytes()); // one given
    assert!(decode(&e).unwrap_err().contains("ill-formed"));
    assert_eq!(open(1, &e), Err(CACHALOT_ERR_INVALID_ARGUMENT));
    // 'r': a count that does not match, a run of 0 bytes, runs whose
    // sizes overflow
    let runs = |n: u64, sizes: &[u64]| {
        // (descriptor 12345: none this test exported)
        let mut r = vec![2, b'r'];
        r.extend_from_slice(&1i32.to_ne_bytes());
        r.extend_from_slice(&[0; 4]);
        r.extend_from_slice(&n.to_ne_bytes());
        for &b in sizes {
            r.extend_from_slice(&12345i32.to_ne_bytes());
            r.extend_from_slice(&[0; 4]);
            r.extend_from_slice(&b.to_ne_bytes());
        }
        r
    };
    for bad in [
        runs(3, &[2 << 20, 4 << 20]),
        runs(0, &[]),
        runs(2, &[2 << 20, 0]),
        runs(2, &[u64::MAX, 2 << 20]),
        runs(u64::MAX, &[2 << 20]),
    ] {
        assert!(decode(&bad).unwrap_err().contains("ill-formed"), "{bad:?}");
        assert_eq!(open(1, &bad), Err(CACHALOT_ERR_INVALID_ARGUMENT));
    }
    // well-formed, naming descriptors nobody exported: the device refuses
    assert!(matches!(
        decode(&runs(1, &[2 << 20])),
        Ok(Decoded::Runs { .. })
    ));
    assert_eq!(open(1, &runs(1, &[2 << 20])), Err(CACHALOT_ERR_BACKEND));
    assert!(matches!(decode(&[9u8; 64]), Ok(Decoded::Segment(_))));
    // a forged legacy handle: the device refuses it
    assert_eq!(open(1, &[9u8; 64]), Err(CACHALOT_ERR_BACKEND));
    assert_eq!(open_handles(), 0);
}
