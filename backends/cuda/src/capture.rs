//! Stream capture: graph nodes, capture modes, the `GraphCapture`
//! implementation, and the graphs and executable graphs a capture makes.

use super::*;

/// A node of a capture graph: a copyable, hashable newtype over the raw
/// `CUgraphNode` value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaNode(usize);

impl CudaNode {
    /// The raw `CUgraphNode`.
    pub fn as_raw(self) -> sys::CUgraphNode {
        std::ptr::with_exposed_provenance_mut(self.0)
    }

    pub(crate) fn from_raw(raw: sys::CUgraphNode) -> Self {
        CudaNode(raw.expose_provenance())
    }
}

impl fmt::Debug for CudaNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaNode({:#x})", self.0)
    }
}

/// Stream capture mode (`CUstreamCaptureMode`) for [`CudaBackend::begin_capture`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// Unsafe calls are prohibited in every thread while capturing.
    #[default]
    Global,
    /// Unsafe calls are prohibited in the capturing thread only.
    ThreadLocal,
    /// No prohibition.
    Relaxed,
}

impl CaptureMode {
    pub(crate) fn raw(self) -> sys::CUstreamCaptureMode {
        match self {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Kind of a graph node (`CUgraphNodeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphNodeKind {
    /// Kernel launch.
    Kernel,
    /// Memory copy.
    Memcpy,
    /// Memset.
    Memset,
    /// Host function.
    Host,
    /// Child graph.
    Graph,
    /// Empty node (e.g. a free marker).
    Empty,
    /// Event wait.
    WaitEvent,
    /// Event record.
    EventRecord,
    /// External semaphore signal.
    ExtSemasSignal,
    /// External semaphore wait.
    ExtSemasWait,
    /// Graph memory allocation (`cudaMallocAsync` captured).
    MemAlloc,
    /// Graph memory free.
    MemFree,
    /// Batched memory operation.
    BatchMemOp,
    /// Conditional node.
    Conditional,
    /// A type these bindings do not know, with its raw value.
    Other(u32),
}

impl GraphNodeKind {
    pub(crate) fn from_raw(t: u32) -> Self {
        match t {
            0 => Self::Kernel,
            1 => Self::Memcpy,
            2 => Self::Memset,
            3 => Self::Host,
            4 => Self::Graph,
            5 => Self::Empty,
            6 => Self::WaitEvent,
            7 => Self::EventRecord,
            8 => Self::ExtSemasSignal,
            9 => Self::ExtSemasWait,
            10 => Self::MemAlloc,
            11 => Self::MemFree,
            12 => Self::BatchMemOp,
            13 => Self::Conditional,
            other => Self::Other(other),
        }
    }
}

impl GraphCapture<CudaStream> for CudaBackend {
    type Node = CudaNode;

    fn capture_state(
        &self,
        stream: CudaStream,
        terminals: &mut Vec<CudaNode>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        terminals.clear();
        if !self.ctx.capture {
            return Ok((CaptureStatus::None, 0));
        }
        let raw = self.raw_capture_info(stream, "cuStreamGetCaptureInfo")?;
        let status = match raw.status {
            0 => return Ok((CaptureStatus::None, 0)),
            1 => CaptureStatus::Active,
            2 => CaptureStatus::Invalidated,
            other => {
                return Err(BackendError::new(
                    NAME,
                    "cuStreamGetCaptureInfo",
                    0,
                    format!("unknown capture status {other}"),
                ));
            }
        };
        terminals.extend(raw.deps.into_iter().map(CudaNode::from_raw));
        Ok((status, raw.id))
    }

    fn extend_node_dependencies(
        &self,
        node: CudaNode,
        out: &mut Vec<CudaNode>,
    ) -> Result<(), BackendError> {
        if !self.ctx.capture {
            return Err(unsupported_capture("cuGraphNodeGetDependencies"));
        }
        let _b = self.ctx.bind("cuGraphNodeGetDependencies")?;
        let deps = driver::graph_node_get_dependencies(node.as_raw())
            .map_err(to_backend("cuGraphNodeGetDependencies"))?;
        out.extend(deps.into_iter().map(CudaNode::from_raw));
        Ok(())
    }

    fn add_empty_node(
        &self,
        stream: CudaStream,
        deps: &[CudaNode],
    ) -> Result<CudaNode, BackendError> {
        let raw = self.raw_capture_info(stream, "cuGraphAddEmptyNode")?;
        if raw.status != 1 || raw.graph.is_null() {
            return Err(BackendError::new(
                NAME,
                "cuGraphAddEmptyNode",
                CUDA_ERROR_ILLEGAL_STATE,
                "the stream is not capturing",
            ));
        }
        let deps: Vec<sys::CUgraphNode> = deps.iter().map(|n| n.as_raw()).collect();
        let _b = self.ctx.bind("cuGraphAddEmptyNode")?;
        let node = driver::graph_add_empty_node(raw.graph, &deps)
            .map_err(to_backend("cuGraphAddEmptyNode"))?;
        Ok(CudaNode::from_raw(node))
    }

    fn update_capture_dependencies(
        &self,
        stream: CudaStream,
        nodes: &[CudaNode],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        if !self.ctx.capture {
            return Err(unsupported_capture("cuStreamUpdateCaptureDependencies"));
        }
        let flags = match mode {
            DependencyUpdate::Add => {
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES
            }
            DependencyUpdate::Set => {
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES
            }
        } as u32;
        let mut raw: Vec<sys::CUgraphNode> = nodes.iter().map(|n| n.as_raw()).collect();
        let _b = self.ctx.bind("cuStreamUpdateCaptureDependencies")?;
        driver::stream_update_capture_dependencies(stream.as_raw(), &mut raw, flags)
            .map_err(to_backend("cuStreamUpdateCaptureDependencies"))
    }
}

/// A graph returned by [`CudaBackend::end_capture`]; destroyed on drop.
pub struct CudaGraph {
    pub(crate) raw: usize,
    pub(crate) ctx: Arc<Context>,
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraph({:#x})", self.raw)
    }
}

impl CudaGraph {
    /// The raw `CUgraph`.
    pub fn as_raw(&self) -> sys::CUgraph {
        std::ptr::with_exposed_provenance_mut(self.raw)
    }

    /// All nodes of the graph.
    pub fn nodes(&self) -> Result<Vec<CudaNode>, BackendError> {
        let _b = self.ctx.bind("cuGraphGetNodes")?;
        let nodes =
            driver::graph_get_nodes(self.as_raw()).map_err(to_backend("cuGraphGetNodes"))?;
        Ok(nodes.into_iter().map(CudaNode::from_raw).collect())
    }

    /// The kind of every node of the graph.
    pub fn node_kinds(&self) -> Result<Vec<GraphNodeKind>, BackendError> {
        let nodes = self.nodes()?;
        let _b = self.ctx.bind("cuGraphNodeGetType")?;
        nodes
            .into_iter()
            .map(|n| {
                driver::graph_node_get_type(n.as_raw())
                    .map(GraphNodeKind::from_raw)
                    .map_err(to_backend("cuGraphNodeGetType"))
            })
            .collect()
    }

    /// How many nodes of `kind` the graph has (e.g. [`GraphNodeKind::MemAlloc`]).
    pub fn count_nodes(&self, kind: GraphNodeKind) -> Result<usize, BackendError> {
        Ok(self
            .node_kinds()?
            .into_iter()
            .filter(|k| *k == kind)
            .count())
    }

    /// Instantiates the graph for launching.
    pub fn instantiate(&self) -> Result<CudaGraphExec, BackendError> {
        let _b = self.ctx.bind("cuGraphInstantiateWithFlags")?;
        let e = driver::graph_instantiate(self.as_raw())
            .map_err(to_backend("cuGraphInstantiateWithFlags"))?;
        Ok(CudaGraphExec {
            raw: e.expose_provenance(),
            ctx: Arc::clone(&self.ctx),
        })
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if let Ok(_b) = self.ctx.bind("cuGraphDestroy") {
            let _ = driver::graph_destroy(self.as_raw());
        }
    }
}

/// An instantiated graph; destroyed on drop.
pub struct CudaGraphExec {
    pub(crate) raw: usize,
    pub(crate) ctx: Arc<Context>,
}

impl fmt::Debug for CudaGraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaGraphExec({:#x})", self.raw)
    }
}

impl CudaGraphExec {
    /// Launches (replays) the graph on `stream`.
    pub fn launch(&self, stream: CudaStream) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuGraphLaunch")?;
        driver::graph_launch(
            std::ptr::with_exposed_provenance_mut(self.raw),
            stream.as_raw(),
        )
        .map_err(to_backend("cuGraphLaunch"))
    }
}

impl Drop for CudaGraphExec {
    fn drop(&mut self) {
        if let Ok(_b) = self.ctx.bind("cuGraphExecDestroy") {
            let _ = driver::graph_exec_destroy(std::ptr::with_exposed_provenance_mut(self.raw));
        }
    }
}
