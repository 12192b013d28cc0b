//! A random multi-stream [`Program`](super::Program): its generation, its
//! run on a device (mock or CUDA) with the capture, and its export as a
//! PyTorch script.

use super::*;

impl Program {
    pub(super) fn generate(p: &SimParams) -> Self {
        let mut rng = SplitMix64::new(p.seed);
        let mut ops = Vec::with_capacity(p.ops as usize);
        let mut live: Vec<(u32, u32)> = Vec::new();
        let mut ids = 0u32;
        // Vector clocks of the streams (operations each has seen of every
        // stream) and each allocation's (stream, clock) of its write: a use
        // on another stream first waits for the write when not yet ordered
        // after it, as a correct program must.
        let n = p.streams as usize;
        let mut clocks: Vec<Vec<u64>> = vec![vec![0; n]; n];
        let mut written: Vec<(u32, u64)> = Vec::new();
        let join = |clocks: &mut Vec<Vec<u64>>, a: usize, b: usize| {
            let (ca, cb) = if a < b {
                let (x, y) = clocks.split_at_mut(b);
                (&mut x[a], &y[0])
            } else {
                let (x, y) = clocks.split_at_mut(a);
                (&mut y[0], &x[b])
            };
            for (u, v) in ca.iter_mut().zip(cb) {
                *u = (*u).max(*v);
            }
        };
        for _ in 0..p.ops {
            let r = rng.unit();
            if r < p.p_join {
                let waiter = rng.below(u64::from(p.streams)) as u32;
                let mut other = rng.below(u64::from(p.streams - 1)) as u32;
                if other >= waiter {
                    other += 1;
                }
                ops.push(Op::Wait { waiter, other });
                join(&mut clocks, waiter as usize, other as usize);
            } else if r < p.p_join + p.p_alloc || live.is_empty() {
                let stream = rng.below(u64::from(p.streams)) as u32;
                let bytes = draw_size(&mut rng);
                ops.push(Op::Alloc {
                    id: ids,
                    stream,
                    bytes,
                });
                live.push((ids, stream));
                let c = &mut clocks[stream as usize][stream as usize];
                *c += 1;
                written.push((stream, *c));
                ids += 1;
            } else if r < p.p_join + p.p_alloc + p.p_free {
                let i = rng.below(live.len() as u64) as usize;
                let (id, _) = live.swap_remove(i);
                ops.push(Op::Free { id });
            } else {
                let (id, own) = live[rng.below(live.len() as u64) as usize];
                let mut stream = rng.below(u64::from(p.streams - 1)) as u32;
                if stream >= own {
                    stream += 1;
                }
                let (ws, wc) = written[id as usize];
                if clocks[stream as usize][ws as usize] < wc {
                    ops.push(Op::Wait {
                        waiter: stream,
                        other: ws,
                    });
                    join(&mut clocks, stream as usize, ws as usize);
                }
                clocks[stream as usize][stream as usize] += 1;
                ops.push(Op::Use { id, stream });
            }
        }
        Self {
            streams: p.streams,
            ops,
            ids,
            config: AllocatorConfig::default(),
            device_bytes: DEVICE_BYTES,
        }
    }

    /// Runs the program captured on a fresh simulated device (an H200
    /// unless $CACHALOT_MOCK_MEMORY says otherwise) that places
    /// segments by `placement`. `unordered`: every allocation on the first
    /// stream and no `record_stream` (the packing bound; unsafe by design).
    pub(super) fn run_mock(
        &self,
        mode: CaptureReuse,
        race_checking: bool,
        check: bool,
        unordered: bool,
        placement: Placement,
    ) -> Result<Outcome, String> {
        let m = MockConfig::new(self.device_bytes)
            .placement(placement)
            .auto_complete(true)
            .race_checking(race_checking)
            .build();
        self.run_on(m, mode, check, unordered)
    }

    /// Runs the program captured on device 0 of the CUDA driver.
    #[cfg(feature = "cuda")]
    pub(super) fn run_cuda(&self, mode: CaptureReuse, check: bool) -> Result<Outcome, String> {
        let b = cachalot::cuda::CudaBackend::new(0).map_err(|e| e.to_string())?;
        self.run_on(b, mode, check, false)
    }

    /// Runs the program captured on `device` with reuse mode `mode`.
    pub(super) fn run_on<D: SimDevice>(
        &self,
        device: D,
        mode: CaptureReuse,
        check: bool,
        unordered: bool,
    ) -> Result<Outcome, String> {
        let config = AllocatorConfig {
            graph_capture_record_stream_reuse: mode,
            ..self.config.clone()
        };
        let a = CachingAllocator::with_config(device, config).map_err(|e| e.to_string())?;
        let d = a.backend();
        let mut keep = Vec::new();
        let mut streams: Vec<D::Stream> = Vec::new();
        for _ in 0..self.streams {
            let (s, k) = d.sim_stream()?;
            streams.push(s);
            keep.push(k);
        }
        let s0 = streams[0];
        let pool = graph_pool_handle();
        let checkpoint = |what: &str| -> Result<(), String> {
            if check {
                a.check_invariants()
                    .map_err(|e| format!("invariant violated after {what}: {e}"))?;
            }
            Ok(())
        };
        let mut addr: Vec<u64> = vec![0; self.ids as usize];
        let mut bytes: Vec<u64> = vec![0; self.ids as usize];
        let mut used_elsewhere: Vec<bool> = vec![false; self.ids as usize];
        // Ranges of blocks freed with cross-stream uses, not yet handed out again.
        let mut deferred: BTreeMap<u64, u64> = BTreeMap::new();
        let mut reused = 0u64;

        let t0 = Instant::now();
        // the capture proper, in one out-of-line function (profilers can
        // attribute exactly what `capture_ns` measures to it)
        let graph = timed_region(|| -> Result<_, String> {
            a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s0))
                .map_err(|e| e.to_string())?;
            d.sim_begin(s0)?;
            for &s in &streams[1..] {
                d.sim_wait(s, s0)?;
            }
            for op in &self.ops {
                match *op {
                    Op::Alloc {
                        id,
                        stream,
                        bytes: n,
                    } => {
                        let s = streams[stream as usize];
                        let p = a
                            .allocate(n, if unordered { s0 } else { s })
                            .map_err(|e| e.to_string())?;
                        let end = p + n;
                        let hits: Vec<u64> = deferred
                            .range(..end)
                            .rev()
                            .take_while(|(_, e)| **e > p)
                            .map(|(k, _)| *k)
                            .collect();
                        // (ranges are disjoint and sorted: walking down from
                        // `end` stops at the first one ending at or below `p`)
                        for k in hits {
                            deferred.remove(&k);
                            reused += 1;
                        }
                        d.sim_touch(s, p, n, u64::from(id) + 1)?;
                        addr[id as usize] = p;
                        bytes[id as usize] = n;
                    }
                    Op::Use { id, stream } => {
                        let s = streams[stream as usize];
                        let p = addr[id as usize];
                        d.sim_touch(s, p, bytes[id as usize], u64::from(id) + 1)?;
                        if !unordered {
                            a.record_stream(p, s).map_err(|e| e.to_string())?;
                        }
                        used_elsewhere[id as usize] = true;
                    }
                    Op::Free { id } => {
                        let p = addr[id as usize];
                        a.free(p).map_err(|e| e.to_string())?;
                        if used_elsewhere[id as usize] {
                            deferred.insert(p, p + bytes[id as usize]);
                        }
                        addr[id as usize] = 0;
                    }
                    Op::Wait { waiter, other } => {
                        d.sim_wait(streams[waiter as usize], streams[other as usize])?;
                    }
                }
                checkpoint("an operation")?;
            }
            for &s in &streams[1..] {
                d.sim_wait(s0, s)?;
            }
            let graph = d.sim_end(s0)?;
            a.end_allocate_to_pool(pool).map_err(|e| e.to_string())?;
            Ok(graph)
        })?;
        let capture_ns = t0.elapsed().as_nanos();
        checkpoint("the capture")?;
        let races = d.sim_races();
        let stats = a.stats();
        let out = Outcome {
            peak_reserved: stats.reserved_bytes.all().peak as u64,
            peak_allocated: stats.allocated_bytes.all().peak as u64,
            reused_blocks: reused,
            races,
            capture_ns,
        };
        for p in addr.into_iter().filter(|&p| p != 0) {
            a.free(p).map_err(|e| e.to_string())?;
        }
        drop(graph);
        a.release_pool(pool).map_err(|e| e.to_string())?;
        a.empty_cache().map_err(|e| e.to_string())?;
        checkpoint("the clean-up")?;
        drop(keep);
        Ok(out)
    }

    /// A Python script running this program with PyTorch under
    /// `torch.cuda.graph` capture; it prints one JSON line.
    pub(super) fn to_pytorch(&self, p: &SimParams) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# Generated by `cachalot capture-sim --streams {} --ops {} --p-join {} --p-alloc {} \
             --p-free {} --seed {} --emit-pytorch ...`.",
            p.streams, p.ops, p.p_join, p.p_alloc, p.p_free, p.seed
        );
        s.push_str(
            "# The same random program with real tensors and streams, captured into a CUDA\n\
             # graph: an allocation is a tensor written on its stream, a use is a copy on\n\
             # another stream plus record_stream, a free drops the last reference, waits\n\
             # are wait_stream. Prints the capture's peak reserved and allocated bytes.\n\
             # Set PYTORCH_CUDA_ALLOC_CONF=graph_capture_record_stream_reuse:True|False.\n\
             import json, os, time\nimport torch\n\n",
        );
        let _ = writeln!(s, "NSTREAMS = {}", self.streams);
        let _ = writeln!(s, "NIDS = {}", self.ids);
        let _ = writeln!(s, "SCRATCH = {SCRATCH_BYTES}");
        s.push_str("# (0, id, stream, bytes) alloc; (1, id, stream) use; (2, id) free; (3, a, b) a.wait_stream(b)\nOPS = [\n");
        for (i, op) in self.ops.iter().enumerate() {
            let _ = match *op {
                Op::Alloc { id, stream, bytes } => write!(s, "(0,{id},{stream},{bytes}),"),
                Op::Use { id, stream } => write!(s, "(1,{id},{stream}),"),
                Op::Free { id } => write!(s, "(2,{id}),"),
                Op::Wait { waiter, other } => write!(s, "(3,{waiter},{other}),"),
            };
            if i % 8 == 7 {
                s.push('\n');
            }
        }
        s.push_str("\n]\n\n");
        s.push_str(PY_MAIN);
        s
    }
}

const PY_MAIN: &str = r#"def main():
    dev = torch.device("cuda")
    S = [torch.cuda.Stream() for _ in range(NSTREAMS)]
    SC = [torch.empty(SCRATCH, dtype=torch.uint8, device=dev) for _ in range(NSTREAMS)]
    T = [None] * NIDS
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_reserved = torch.cuda.memory_reserved()
    base_allocated = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.cuda.graph(g, stream=S[0]):
        for k in range(1, NSTREAMS):
            S[k].wait_stream(S[0])
        for op in OPS:
            kind = op[0]
            if kind == 0:
                with torch.cuda.stream(S[op[2]]):
                    T[op[1]] = torch.empty(op[3], dtype=torch.uint8, device=dev)
                    T[op[1]].fill_(1)
            elif kind == 1:
                x = T[op[1]]
                n = min(x.numel(), SCRATCH)
                with torch.cuda.stream(S[op[2]]):
                    SC[op[2]][:n].copy_(x[:n])
                x.record_stream(S[op[2]])
                del x
            elif kind == 2:
                T[op[1]] = None
            else:
                S[op[1]].wait_stream(S[op[2]])
        for k in range(1, NSTREAMS):
            S[0].wait_stream(S[k])
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    st = torch.cuda.memory_stats()
    print(json.dumps(dict(
        conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        peak_reserved=st["reserved_bytes.all.peak"] - base_reserved,
        peak_allocated=st["allocated_bytes.all.peak"] - base_allocated,
        capture_s=capture_s,
        torch=torch.__version__,
    )), flush=True)


if __name__ == "__main__":
    main()
"#;
