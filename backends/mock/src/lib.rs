//! # cachalot-mock
//!
//! A simulated accelerator implementing [`cachalot_core::Backend`]. It touches
//! no real memory (a 100 GiB trace replays on a laptop), is fully
//! deterministic, and is what the engine's tests, the trace replay and the
//! property tests run on.
//!
//! ## Model
//!
//! * **Memory.** [`MockBackend::new`] (or [`MockConfig`]) sets the capacity.
//!   `malloc(size)` needs a positive multiple of 512 B (else a
//!   [`BackendError`](cachalot_core::BackendError) with
//!   [`codes::INVALID_VALUE`]); it fails with
//!   `DeviceAllocError::OutOfMemory` when live bytes (+ simulated external
//!   usage) + size exceed the capacity. Addresses come from a large range
//!   (default base `0x7f00_0000_0000 + device × 16 TiB`
//!   ([`DEVICE_ADDRESS_STRIDE`]), size `max(1 TiB, 4 × capacity)` up to
//!   16 TiB) placed by a [`Placement`] policy; segments of at least 2 MiB
//!   start 2 MiB-aligned, smaller ones 512 B-aligned. Different device
//!   indices get disjoint ranges, so one device's pointers are unknown to
//!   another. `free` of an unknown pointer or with the wrong size is an
//!   error, never a panic.
//! * **Contents.** The mock stores no bytes but remembers which tag each
//!   eager use wrote where ([`MockBackend::read_tags`],
//!   [`MockBackend::tag_at`]); freeing a segment forgets its contents.
//! * **Virtual memory.** [`MockBackend`] implements
//!   [`cachalot_core::VirtualMemory`] (`Backend::virtual_memory` answers
//!   `Some` unless [`MockConfig::virtual_memory`] is off; then every call
//!   fails with [`codes::NOT_SUPPORTED`]). Every size and address is a
//!   multiple of the granularity ([`MockConfig::granularity`], 2 MiB by
//!   default), else [`codes::INVALID_VALUE`]. `reserve` places ranges
//!   lowest-first in their own address range, above the segment range
//!   ([`MockBackend::reservation_range`]); `create_physical` counts against
//!   the capacity like `malloc` (and `malloc` against physical memory; OOM
//!   as `DeviceAllocError::OutOfMemory`); `memory_info` reports both. A
//!   mapping starts inaccessible; `set_access` (own device only, else
//!   [`codes::INVALID_DEVICE`]) makes it accessible. The contents of mapped
//!   bytes belong to the physical allocation: they survive `unmap` and show
//!   wherever it is mapped next. Misuse is a typed error and changes
//!   nothing: mapping over mapped pages ([`codes::ALREADY_MAPPED`]);
//!   mapping, unmapping or `set_access` outside one reservation
//!   ([`codes::INVALID_DEVICE_POINTER`]); a physical allocation mapped with
//!   a size other than its own, `unmap`/`set_access` of part of a mapping,
//!   `unmap` of more than one mapping at once (CUDA's `cuMemUnmap` takes
//!   exactly one; `set_access` may span several) ([`codes::INVALID_VALUE`]); `unmap`/`set_access` over pages not mapped
//!   ([`codes::NOT_MAPPED`]); `unmap` of a mapping that eager work not yet
//!   complete touches ([`codes::NOT_READY`]: `cuMemUnmap` is not stream
//!   ordered, synchronize first); `unreserve` of a range with pages still
//!   mapped or `release_physical` of memory still mapped
//!   ([`codes::ILLEGAL_STATE`]; stricter than CUDA, which defers the free);
//!   an unknown or released handle ([`codes::INVALID_RESOURCE_HANDLE`]); an
//!   unknown reservation ([`codes::INVALID_DEVICE_POINTER`]) or a wrong
//!   size ([`codes::INVALID_VALUE`]) to `unreserve`. A use of reserved bytes
//!   that are not mapped or not accessible is submitted but reported
//!   ([`MockBackend::invalid_accesses`]). Accessors:
//!   [`MockBackend::live_physical_bytes`], [`MockBackend::reservation_count`],
//!   [`MockBackend::mappings`], ...; [`MockBackend::vmm_usage`] and
//!   [`MockBackend::assert_no_vmm_leaks`] check that nothing leaked.
//! * **Streams and work.** Stream 0 is the default (legacy) stream; others
//!   come from [`MockBackend::create_stream`]. Each stream counts submitted
//!   and completed units of work. Work ([`MockBackend::launch`],
//!   [`MockBackend::use_memory`], [`MockBackend::launch_graph`]) completes only
//!   when the test says so ([`MockBackend::complete`],
//!   [`MockBackend::complete_n`], [`MockBackend::complete_all`], or a host
//!   synchronisation), at once in auto-complete mode, or late on its own
//!   after a seeded random number of later operations
//!   ([`Completion::Random`]); see [`Completion`]. Completing work
//!   also completes the work it waits on (through `stream_wait_event`).
//!   Streams are non-blocking: the default stream does not synchronise
//!   implicitly with the others.
//! * **Events.** `record_event` snapshots the stream's submitted count and
//!   vector clock; `query_event` is "completed ≥ recorded position" (true for
//!   a never-recorded event); `synchronize_event` completes the work up to
//!   that position; `query_stream` is "completed ≥ submitted";
//!   `stream_wait_event` merges the event's clock into the
//!   stream's (an ordering edge). Unknown, destroyed or foreign events are
//!   [`codes::INVALID_RESOURCE_HANDLE`] errors.
//! * **Race checker.** Every use records `[addr, addr+len)` with a tag (one
//!   per allocation, chosen by the harness). Two overlapping uses with
//!   different tags race unless ordered: outside capture by happens-before
//!   (same stream; a `stream_wait_event` chain, i.e. vector clocks; or the
//!   earlier use had completed when the later one was submitted — the host
//!   observed it), inside one capture by a path in the graph. Races are
//!   found at the later use's submission ([`MockBackend::races`]): every
//!   later use that races gets at least one report, at most one per earlier
//!   use. Outside capture, an earlier use followed by an ordered use of the
//!   same tag is represented by that newer use (any use racing with the old
//!   one races with the new one too), and completed uses are dropped, so
//!   memory stays bounded. `free` of a segment forgets its uses (cudaFree
//!   synchronises implicitly). Graph launches are checked as one unit of
//!   work carrying all of the graph's uses.
//! * **Capture.** CUDA stream capture semantics (spec section 1.3):
//!   [`MockBackend::begin_capture`] / [`MockBackend::end_capture`], capture
//!   ids from 1, per-stream terminal sets (work collapses the set to the new
//!   node; `record_event` captures the set; `stream_wait_event` on a
//!   captured event adds its nodes and forks a non-capturing stream into the
//!   capture), `capture_info`, `node_dependencies`, `add_empty_node`,
//!   `update_capture_dependencies` (Add/Set). Misuse invalidates the
//!   capture like CUDA: querying or synchronising an event recorded in a
//!   capture, querying or synchronising a capturing stream or the device,
//!   waiting on uncaptured work from a capturing stream, merging two
//!   captures, ending on the wrong stream; in [`CaptureMode::Global`] (default) also any
//!   `query_event` / `query_stream` / `synchronize_event` while a capture
//!   is active.
//!   `malloc` and `free` are allowed during capture (relaxed mode) and
//!   counted. `end_capture` fails with [`codes::STREAM_CAPTURE_UNJOINED`]
//!   when a forked stream's terminal nodes are not ancestors of the origin's.
//! * **Failure injection.** Every fallible `Backend`, `GraphCapture` and
//!   `VirtualMemory` entry point ([`MockCall`]) can be made to fail at its
//!   n-th call from now ([`MockBackend::fail_call_at`],
//!   [`MockBackend::fail_call_at_with`]) or at every call
//!   ([`MockBackend::fail_call_always`]), with a typed error and no side
//!   effect; [`MockBackend::call_count`] numbers the calls of
//!   each kind and [`MockCounters::injected`] counts the failures that fired.
//! * **Hooks.** [`MockBackend::set_malloc_hook`] runs a function at the
//!   start of every `malloc`, with no lock of the mock held (a test holds
//!   a device allocation in flight there).
//!
//! ```
//! use cachalot_core::Backend;
//! use cachalot_mock::MockBackend;
//!
//! let dev = MockBackend::new(1 << 30);
//! let s1 = dev.create_stream();
//! let s2 = dev.create_stream();
//! let p = dev.malloc(2 << 20).unwrap();
//! dev.use_memory(s1, p, 1024, 1).unwrap();
//! // Reusing the bytes for another allocation on s2 without ordering: race.
//! dev.use_memory(s2, p, 512, 2).unwrap();
//! assert_eq!(dev.race_count(), 1);
//! // Ordered through an event: no race.
//! let e = dev.create_event().unwrap();
//! dev.record_event(&e, s2).unwrap();
//! dev.stream_wait_event(s1, &e).unwrap();
//! dev.use_memory(s1, p, 512, 3).unwrap();
//! assert_eq!(dev.race_count(), 1);
//! dev.destroy_event(e).unwrap();
//! ```
#![forbid(unsafe_code)]

mod backend;
mod config;
mod data;
mod graph;
mod ipc;
mod shadow;
mod space;
mod types;
mod vmm;

pub use backend::{MallocHook, MockBackend};
pub use config::{DEFAULT_BASE_ADDRESS, DEFAULT_GRANULARITY, DEVICE_ADDRESS_STRIDE, MockConfig};
pub use graph::{MockGraph, MockNode, NodeKind};
pub use space::{BIG_ALIGN, CHUNK, Placement, SMALL_ALIGN, alignment_for};
pub use types::{
    CaptureMode, Completion, Failure, InvalidAccess, InvalidAccessKind, MallocFailure, MemUse,
    MockCall, MockCounters, MockEvent, MockStream, Race, Submitted, UseSite, codes,
};
pub use vmm::{MockMapping, MockPhysical, VmmUsage};
