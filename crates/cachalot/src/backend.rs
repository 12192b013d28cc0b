//! Run-time choice of the backend: [`BackendKind`], and the facade-local
//! trait that lets the dispatch enum open devices and streams of every
//! backend the same way.

use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;

use cachalot_core::config::echo;
use cachalot_core::{Backend, DeviceIndex, Error};
use cachalot_mock::{MockBackend, MockConfig, MockStream};

/// Environment variable naming the backend (`mock`, `cuda`, `hip`, `level-zero`).
pub const BACKEND_ENV: &str = "CACHALOT_BACKEND";
/// Environment variable: number of simulated devices of the mock backend
/// (default 1; at most [`MAX_MOCK_DEVICES`]).
pub const MOCK_DEVICES_ENV: &str = "CACHALOT_MOCK_DEVICES";
/// Environment variable: capacity in bytes of each simulated device
/// (default: an H200's; at most [`MAX_MOCK_MEMORY`]).
pub const MOCK_MEMORY_ENV: &str = "CACHALOT_MOCK_MEMORY";
/// Most simulated devices [`MOCK_DEVICES_ENV`] may ask for (the largest
/// real hosts have 16).
pub const MAX_MOCK_DEVICES: u32 = 64;
/// Largest capacity [`MOCK_MEMORY_ENV`] may ask for: 2^42 bytes (4 TiB),
/// far above any device, the most whose default address range (four
/// times the capacity) fits in the 16 TiB each mock device's addresses may
/// span ([`cachalot_mock::DEVICE_ADDRESS_STRIDE`]), and far below
/// `i64::MAX`, so the signed byte statistics of a full device cannot
/// overflow.
pub const MAX_MOCK_MEMORY: u64 = 1 << 42;
/// Total memory of an NVIDIA H200 as `cudaMemGetInfo` reports it: the mock's default capacity.
pub const H200_TOTAL_MEMORY: u64 = 150_754_820_096;

/// An accelerator backend, chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The simulated device of `cachalot-mock` (always compiled in).
    Mock,
    /// NVIDIA CUDA (feature `cuda`).
    Cuda,
    /// AMD HIP / ROCm (feature `hip`).
    Hip,
    /// Intel oneAPI Level Zero (feature `level-zero`).
    LevelZero,
}

impl BackendKind {
    /// Every kind, in detection order of the real ones, the mock last.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Cuda,
        BackendKind::Hip,
        BackendKind::LevelZero,
        BackendKind::Mock,
    ];

    /// The name used on the command line and in [`BACKEND_ENV`].
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Mock => "mock",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
            BackendKind::LevelZero => "level-zero",
        }
    }

    /// Whether this build includes the backend (its cargo feature is on).
    pub fn is_compiled(self) -> bool {
        match self {
            BackendKind::Mock => true,
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Hip => cfg!(feature = "hip"),
            BackendKind::LevelZero => cfg!(feature = "level-zero"),
        }
    }

    /// Number of devices of this backend. Errors when the backend is not
    /// compiled in ([`Error::InvalidArgument`]) or its driver is unusable
    /// ([`Error::NoDevice`]).
    pub fn device_count(self) -> Result<u32, Error> {
        match self {
            BackendKind::Mock => Ok(MockSettings::from_env()?.devices),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => cachalot_cuda::device_count(),
            #[cfg(feature = "hip")]
            BackendKind::Hip => Ok(cachalot_hip::HipBackend::device_count()?),
            #[cfg(feature = "level-zero")]
            BackendKind::LevelZero => Ok(cachalot_level_zero::LevelZeroBackend::device_count()?),
            #[allow(unreachable_patterns)]
            other => Err(other.not_compiled()),
        }
    }

    /// Whether the backend is compiled in and reports at least one device.
    pub fn is_available(self) -> bool {
        matches!(self.device_count(), Ok(n) if n > 0)
    }

    /// The backend to use: [`BACKEND_ENV`] when set (an unknown name is an
    /// error), else the first real backend with a device (CUDA, HIP, Level
    /// Zero), else the mock.
    pub fn detect() -> Result<Self, Error> {
        match std::env::var_os(BACKEND_ENV).map(OsString::into_string) {
            Some(Ok(v)) if !v.trim().is_empty() => return v.parse(),
            Some(Err(raw)) => {
                return Err(Error::InvalidEnv {
                    var: BACKEND_ENV,
                    value: echo(&raw.to_string_lossy()),
                    allowed: "UTF-8 text: one of mock, cuda, hip, level-zero".into(),
                });
            }
            _ => {}
        }
        Ok(BackendKind::ALL
            .into_iter()
            .filter(|k| *k != BackendKind::Mock && k.is_compiled())
            .find(|k| k.is_available())
            .unwrap_or(BackendKind::Mock))
    }

    pub(crate) fn not_compiled(self) -> Error {
        Error::InvalidArgument(format!(
            "backend '{}' is not compiled into this build (enable the cargo feature `{}`)",
            self.as_str(),
            self.as_str()
        ))
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = Error;

    /// Parses `mock`, `cuda`, `hip`, `level-zero` (also `level_zero`, `ze`,
    /// `xpu`), case-insensitively.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mock" => Ok(BackendKind::Mock),
            "cuda" => Ok(BackendKind::Cuda),
            "hip" | "rocm" => Ok(BackendKind::Hip),
            "level-zero" | "level_zero" | "levelzero" | "ze" | "xpu" => Ok(BackendKind::LevelZero),
            _ => Err(Error::InvalidArgument(format!(
                "unknown backend '{}' (expected one of: mock, cuda, hip, level-zero)",
                echo(s)
            ))),
        }
    }
}

/// Settings of the global mock devices, from [`MOCK_DEVICES_ENV`] and
/// [`MOCK_MEMORY_ENV`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MockSettings {
    /// Number of simulated devices.
    pub devices: u32,
    /// Capacity of each, in bytes.
    pub total_memory: u64,
}

impl Default for MockSettings {
    fn default() -> Self {
        Self {
            devices: 1,
            total_memory: H200_TOTAL_MEMORY,
        }
    }
}

impl MockSettings {
    /// Reads the environment. A value that is not an integer in its range
    /// ([0, [`MAX_MOCK_DEVICES`]] devices, [0, [`MAX_MOCK_MEMORY`]] bytes)
    /// or not UTF-8 is [`Error::InvalidEnv`] naming the variable, the value
    /// and the range.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_lookup(std::env::var_os)
    }

    /// [`MockSettings::from_env`] over `lookup` instead of the process environment.
    pub(crate) fn from_lookup(
        mut lookup: impl FnMut(&'static str) -> Option<OsString>,
    ) -> Result<Self, Error> {
        let mut s = Self::default();
        if let Some(v) = lookup(MOCK_DEVICES_ENV) {
            let n = env_int(MOCK_DEVICES_ENV, v, u64::from(MAX_MOCK_DEVICES))?;
            s.devices = u32::try_from(n).unwrap_or(MAX_MOCK_DEVICES);
        }
        if let Some(v) = lookup(MOCK_MEMORY_ENV) {
            s.total_memory = env_int(MOCK_MEMORY_ENV, v, MAX_MOCK_MEMORY)?;
        }
        Ok(s)
    }

    /// The mock device `index` with these settings: auto-completing work
    /// (no kernels run, so events complete at once), race checking off, and
    /// the device's own address range (`cachalot_mock::DEVICE_ADDRESS_STRIDE`),
    /// so a pointer of one device is unknown to every other.
    pub fn backend(&self, index: DeviceIndex) -> MockBackend {
        MockConfig::new(self.total_memory)
            .device(index)
            .auto_complete(true)
            .race_checking(false)
            .build()
    }
}

/// The integer in [0, `max`] that the variable `var` holds (surrounding
/// whitespace allowed).
fn env_int(var: &'static str, raw: OsString, max: u64) -> Result<u64, Error> {
    let bad = |v: &str| Error::InvalidEnv {
        var,
        value: echo(v),
        allowed: format!("an integer in [0, {max}]"),
    };
    let v = raw
        .into_string()
        .map_err(|raw| bad(&raw.to_string_lossy()))?;
    match v.trim().parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(bad(&v)),
    }
}

/// What the facade needs from a backend besides [`Backend`]: creating
/// streams it owns, and a numeric handle for each stream.
pub(crate) trait FacadeBackend: Backend + Sized {
    /// A stream the facade owns (destroyed on drop), if the backend has such a type.
    type Owned: Send + Sync + 'static;
    /// Creates a new stream.
    fn create_stream(&self) -> Result<(Self::Stream, Option<Self::Owned>), Error>;
    /// The stream's native handle as a number (`cudaStream_t` value, mock index).
    fn stream_handle(stream: Self::Stream) -> u64;
}

impl FacadeBackend for MockBackend {
    type Owned = ();
    fn create_stream(&self) -> Result<(MockStream, Option<()>), Error> {
        Ok((MockBackend::create_stream(self), None))
    }
    fn stream_handle(stream: MockStream) -> u64 {
        u64::from(stream.index())
    }
}

#[cfg(feature = "cuda")]
impl FacadeBackend for cachalot_cuda::CudaBackend {
    type Owned = cachalot_cuda::OwnedStream;
    fn create_stream(&self) -> Result<(Self::Stream, Option<Self::Owned>), Error> {
        let s = cachalot_cuda::CudaBackend::create_stream(self)?;
        Ok((s.handle(), Some(s)))
    }
    fn stream_handle(stream: Self::Stream) -> u64 {
        stream.addr() as u64
    }
}

#[cfg(feature = "hip")]
impl FacadeBackend for cachalot_hip::HipBackend {
    type Owned = cachalot_hip::OwnedStream;
    fn create_stream(&self) -> Result<(Self::Stream, Option<Self::Owned>), Error> {
        let s = cachalot_hip::HipBackend::create_stream(self)?;
        Ok((s.handle(), Some(s)))
    }
    fn stream_handle(stream: Self::Stream) -> u64 {
        stream.as_raw().expose_provenance() as u64
    }
}

#[cfg(feature = "level-zero")]
impl FacadeBackend for cachalot_level_zero::LevelZeroBackend {
    type Owned = cachalot_level_zero::OwnedStream;
    fn create_stream(&self) -> Result<(Self::Stream, Option<Self::Owned>), Error> {
        let s = cachalot_level_zero::LevelZeroBackend::create_stream(self)?;
        Ok((s.handle(), Some(s)))
    }
    fn stream_handle(stream: Self::Stream) -> u64 {
        stream.as_raw().expose_provenance() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse() {
        for k in BackendKind::ALL {
            assert_eq!(k.as_str().parse::<BackendKind>().unwrap(), k);
        }
        assert_eq!(
            "XPU".parse::<BackendKind>().unwrap(),
            BackendKind::LevelZero
        );
        let e = "tpu".parse::<BackendKind>().unwrap_err();
        assert!(e.to_string().contains("unknown backend 'tpu'"), "{e}");
        assert!(BackendKind::Mock.is_compiled());
        assert_eq!(BackendKind::Mock.device_count().unwrap_or(1), 1);
    }

    #[test]
    fn mock_env_values_are_bounded() {
        let only = |name: &'static str, v: &str| {
            let v = OsString::from(v);
            move |var: &'static str| (var == name).then(|| v.clone())
        };
        for (var, v, allowed) in [
            (MOCK_DEVICES_ENV, "4294967295", "[0, 64]"),
            (MOCK_DEVICES_ENV, "65", "[0, 64]"),
            (MOCK_DEVICES_ENV, "-1", "[0, 64]"),
            (MOCK_DEVICES_ENV, "two", "[0, 64]"),
            (MOCK_DEVICES_ENV, "99999999999999999999999", "[0, 64]"),
            (
                MOCK_MEMORY_ENV,
                "18446744073709551615",
                "[0, 4398046511104]",
            ),
            (MOCK_MEMORY_ENV, "9223372036854775808", "[0, 4398046511104]"),
            (MOCK_MEMORY_ENV, "4398046511105", "[0, 4398046511104]"),
            (MOCK_MEMORY_ENV, "1.5e9", "[0, 4398046511104]"),
        ] {
            let e = MockSettings::from_lookup(only(var, v)).unwrap_err();
            match &e {
                Error::InvalidEnv {
                    var: got,
                    value,
                    allowed: a,
                } => {
                    assert_eq!(*got, var);
                    assert_eq!(value, v);
                    assert!(a.contains(allowed), "{a}");
                }
                e => panic!("{var}={v}: {e:?}"),
            }
            let msg = e.to_string();
            assert!(
                msg.contains(var) && msg.contains(v) && msg.contains(allowed),
                "{msg}"
            );
        }
        let e = MockSettings::from_lookup(only(MOCK_MEMORY_ENV, &"7".repeat(100_000))).unwrap_err();
        assert!(e.to_string().len() < 300, "echoed whole");
        let s = MockSettings::from_lookup(|var| {
            Some(OsString::from(match var {
                MOCK_DEVICES_ENV => " 64 ",
                _ => "4398046511104",
            }))
        })
        .unwrap();
        assert_eq!(s.devices, MAX_MOCK_DEVICES);
        assert_eq!(s.total_memory, MAX_MOCK_MEMORY);
        assert_eq!(
            MockSettings::from_lookup(|_| None).unwrap(),
            MockSettings::default()
        );
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let e = MockSettings::from_lookup(|var| {
                (var == MOCK_DEVICES_ENV).then(|| OsString::from_vec(vec![b'4', 0xff]))
            })
            .unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidEnv {
                        var: MOCK_DEVICES_ENV,
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }
}
