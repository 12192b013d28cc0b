//! Stream capture and graphs: the capture mode, capture info and
//! dependencies, graph nodes, instantiation and launch.

use super::*;

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's capture mode and
/// returns the previous one (as the raw enum value).
pub(crate) fn exchange_capture_mode(mode: sys::CUstreamCaptureMode) -> DResult<u32> {
    let mut m: u32 = mode as u32;
    // SAFETY: `m` is a valid in/out location of the enum's size (repr(u32));
    // reading it back as a u32 is valid for any value the driver writes.
    res(unsafe {
        sys::cuThreadExchangeStreamCaptureMode((&raw mut m).cast::<sys::CUstreamCaptureMode>())
    })?;
    Ok(m)
}

/// Restores a capture mode returned by [`exchange_capture_mode`].
pub(crate) fn restore_capture_mode(raw: u32) -> DResult<()> {
    let mut m: u32 = raw;
    // SAFETY: as in `exchange_capture_mode`; `raw` is a value the driver
    // itself returned, so it is a valid mode for the driver.
    res(unsafe {
        sys::cuThreadExchangeStreamCaptureMode((&raw mut m).cast::<sys::CUstreamCaptureMode>())
    })
}

/// What `cuStreamGetCaptureInfo_v3` reports, with the terminal nodes copied.
pub(crate) struct RawCaptureInfo {
    pub status: u32,
    pub id: u64,
    pub graph: sys::CUgraph,
    pub deps: Vec<sys::CUgraphNode>,
}

/// `cuStreamGetCaptureInfo_v3`; the dependency array is copied at once (it is
/// only valid until the next call on the stream).
pub(crate) fn stream_get_capture_info(s: sys::CUstream) -> DResult<RawCaptureInfo> {
    let mut status: u32 = 0;
    let mut id: u64 = 0;
    let mut graph: sys::CUgraph = ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = ptr::null();
    let mut n: usize = 0;
    // SAFETY: every out-pointer is valid for the call; the status is written
    // into a u32 (the enum is repr(u32)) so any value is readable.
    res(unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s,
            (&raw mut status).cast::<sys::CUstreamCaptureStatus>(),
            &mut id,
            &mut graph,
            &mut deps,
            &mut edges,
            &mut n,
        )
    })?;
    let deps = if deps.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: the driver returned `n` nodes at `deps`, valid until the
        // next call on this stream; we copy them out immediately.
        unsafe { std::slice::from_raw_parts(deps, n) }.to_vec()
    };
    Ok(RawCaptureInfo {
        status,
        id,
        graph,
        deps,
    })
}

/// `cuGraphNodeGetDependencies_v2` (count, then fill).
pub(crate) fn graph_node_get_dependencies(
    node: sys::CUgraphNode,
) -> DResult<Vec<sys::CUgraphNode>> {
    let mut n: usize = 0;
    // SAFETY: with null node and edge arrays (the driver rejects edge data
    // without a node array) it only writes the count to `n`.
    res(unsafe {
        sys::cuGraphNodeGetDependencies_v2(node, ptr::null_mut(), ptr::null_mut(), &mut n)
    })?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut nodes: Vec<sys::CUgraphNode> = vec![ptr::null_mut(); n];
    let blank = sys::CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    let mut edges = vec![blank; n];
    let mut filled = n;
    // SAFETY: `nodes` and `edges` have room for `filled` entries, and the
    // driver writes at most that many, updating `filled`.
    res(unsafe {
        sys::cuGraphNodeGetDependencies_v2(
            node,
            nodes.as_mut_ptr(),
            edges.as_mut_ptr(),
            &mut filled,
        )
    })?;
    nodes.truncate(filled.min(n));
    Ok(nodes)
}

/// `cuGraphAddEmptyNode`.
pub(crate) fn graph_add_empty_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
) -> DResult<sys::CUgraphNode> {
    let mut node: sys::CUgraphNode = ptr::null_mut();
    let deps_ptr = if deps.is_empty() {
        ptr::null()
    } else {
        deps.as_ptr()
    };
    // SAFETY: the driver reads `deps.len()` nodes from `deps_ptr` and writes
    // the new node to a valid out-pointer; live graph (module invariant).
    res(unsafe { sys::cuGraphAddEmptyNode(&mut node, graph, deps_ptr, deps.len()) })?;
    Ok(node)
}

/// `cuStreamUpdateCaptureDependencies_v2` without edge data.
pub(crate) fn stream_update_capture_dependencies(
    s: sys::CUstream,
    nodes: &mut [sys::CUgraphNode],
    flags: c_uint,
) -> DResult<()> {
    let nodes_ptr = if nodes.is_empty() {
        ptr::null_mut()
    } else {
        nodes.as_mut_ptr()
    };
    // SAFETY: the driver reads `nodes.len()` nodes from `nodes_ptr` (the
    // pointer is non-const in the C prototype only); null edge data means
    // default edges; live stream (module invariant).
    res(unsafe {
        sys::cuStreamUpdateCaptureDependencies_v2(s, nodes_ptr, ptr::null(), nodes.len(), flags)
    })
}

/// `cuStreamBeginCapture_v2`.
pub(crate) fn stream_begin_capture(
    s: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> DResult<()> {
    // SAFETY: live stream (module invariant); mode is a valid enum value.
    res(unsafe { sys::cuStreamBeginCapture_v2(s, mode) })
}

/// `cuStreamEndCapture`.
pub(crate) fn stream_end_capture(s: sys::CUstream) -> DResult<sys::CUgraph> {
    let mut g: sys::CUgraph = ptr::null_mut();
    // SAFETY: valid out-pointer; live stream (module invariant).
    res(unsafe { sys::cuStreamEndCapture(s, &mut g) })?;
    Ok(g)
}

/// `cuGraphDestroy`.
pub(crate) fn graph_destroy(g: sys::CUgraph) -> DResult<()> {
    // SAFETY: `g` is a live graph owned by this crate, destroyed once.
    res(unsafe { sys::cuGraphDestroy(g) })
}

/// `cuGraphGetNodes` (count, then fill).
pub(crate) fn graph_get_nodes(g: sys::CUgraph) -> DResult<Vec<sys::CUgraphNode>> {
    let mut n: usize = 0;
    // SAFETY: with a null array the driver only writes the count.
    res(unsafe { sys::cuGraphGetNodes(g, ptr::null_mut(), &mut n) })?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![ptr::null_mut(); n];
    let mut filled = n;
    if n > 0 {
        // SAFETY: `nodes` has room for `filled` entries; the driver writes at
        // most that many and updates `filled`.
        res(unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut filled) })?;
    }
    nodes.truncate(filled.min(n));
    Ok(nodes)
}

/// `cuGraphNodeGetType`, as the raw enum value.
pub(crate) fn graph_node_get_type(node: sys::CUgraphNode) -> DResult<u32> {
    let mut t: u32 = 0;
    // SAFETY: the type is written into a u32 (the enum is repr(u32)), so
    // values unknown to these bindings are still readable.
    res(unsafe { sys::cuGraphNodeGetType(node, (&raw mut t).cast::<sys::CUgraphNodeType>()) })?;
    Ok(t)
}

/// `cuGraphInstantiateWithFlags` (flags 0).
pub(crate) fn graph_instantiate(g: sys::CUgraph) -> DResult<sys::CUgraphExec> {
    let mut e: sys::CUgraphExec = ptr::null_mut();
    // SAFETY: valid out-pointer; live graph (module invariant).
    res(unsafe { sys::cuGraphInstantiateWithFlags(&mut e, g, 0) })?;
    Ok(e)
}

/// `cuGraphLaunch`.
pub(crate) fn graph_launch(e: sys::CUgraphExec, s: sys::CUstream) -> DResult<()> {
    // SAFETY: live handles (module invariant).
    res(unsafe { sys::cuGraphLaunch(e, s) })
}

/// `cuGraphExecDestroy`.
pub(crate) fn graph_exec_destroy(e: sys::CUgraphExec) -> DResult<()> {
    // SAFETY: `e` is a live executable graph owned by this crate, destroyed once.
    res(unsafe { sys::cuGraphExecDestroy(e) })
}
