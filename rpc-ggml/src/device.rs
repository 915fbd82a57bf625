//! ggml devices (CPU, Metal, CUDA, ...): what they are, their memory, their buffers. A backend
//! instance on a device (`Device::init_backend`) is `backend.rs`'s, above graphs.

use std::ffi::{CStr, CString};

use super::buffer::{Buffer, BufferRef};
use super::sys;

/// What kind of device ggml reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accel,
    Other,
}

/// A ggml device. Devices are registered once per process and live until it exits.
#[derive(Clone)]
pub struct Device {
    raw: sys::ggml_backend_dev_t,
    name: String,
    description: String,
    kind: DeviceKind,
    /// The memory this device reports instead of ggml's figure (`-m/--mem`), in bytes.
    reported: Option<u64>,
}

// SAFETY: ggml device handles are process-global registry entries, never freed, and their
// query functions are thread-safe.
unsafe impl Send for Device {}
// SAFETY: see Send; shared references only call thread-safe query functions.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish()
    }
}

fn c_str(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns static (or device-lifetime) NUL-terminated strings for names.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Device {
    /// Every device ggml knows about in this build, in registry order.
    pub fn all() -> Vec<Device> {
        // SAFETY: registry queries without preconditions; backends are built in (static build).
        let n = unsafe { sys::ggml_backend_dev_count() };
        (0..n)
            .filter_map(|i| {
                // SAFETY: i < ggml_backend_dev_count().
                let raw = unsafe { sys::ggml_backend_dev_get(i) };
                Device::from_raw(raw)
            })
            .collect()
    }

    fn from_raw(raw: sys::ggml_backend_dev_t) -> Option<Device> {
        if raw.is_null() {
            return None;
        }
        // SAFETY: raw is a valid registered device.
        let (name, description, t) = unsafe {
            (
                c_str(sys::ggml_backend_dev_name(raw)),
                c_str(sys::ggml_backend_dev_description(raw)),
                sys::ggml_backend_dev_type(raw),
            )
        };
        let kind = match t {
            sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accel,
            _ => DeviceKind::Other,
        };
        Some(Device {
            raw,
            name,
            description,
            kind,
            reported: None,
        })
    }

    /// Looks a device up by its ggml name (e.g. `CPU`, `CUDA0`, `MTL0`), case-insensitively.
    pub fn by_name(name: &str) -> Option<Device> {
        Device::all()
            .into_iter()
            .find(|d| d.name.eq_ignore_ascii_case(name))
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn description(&self) -> &str {
        &self.description
    }
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// `(free, total)` memory in bytes, as the device reports it to clients (GET_DEVICE_MEMORY):
    /// the stock `-m/--mem` figure for both when one was set ([`Device::reporting`]), else
    /// ggml's.
    pub fn memory(&self) -> (u64, u64) {
        match self.reported {
            Some(m) => (m, m),
            None => self.actual_memory(),
        }
    }

    /// This device reporting `bytes` as its free and total memory (the stock `-m/--mem`).
    pub fn reporting(self, bytes: Option<u64>) -> Device {
        Device {
            reported: bytes,
            ..self
        }
    }

    /// `(free, total)` memory in bytes as ggml sees it, whatever the device reports.
    pub fn actual_memory(&self) -> (u64, u64) {
        let mut free = 0usize;
        let mut total = 0usize;
        // SAFETY: valid device, both out-pointers point to live locals.
        unsafe { sys::ggml_backend_dev_memory(self.raw, &mut free, &mut total) };
        (free as u64, total as u64)
    }

    fn buft(&self) -> sys::ggml_backend_buffer_type_t {
        // SAFETY: valid device; the default buffer type is a static object.
        unsafe { sys::ggml_backend_dev_buffer_type(self.raw) }
    }

    /// Alignment of the device's default buffer type.
    pub fn alignment(&self) -> u64 {
        // SAFETY: valid buffer type.
        unsafe { sys::ggml_backend_buft_get_alignment(self.buft()) as u64 }
    }

    /// Largest single allocation of the device's default buffer type.
    pub fn max_size(&self) -> u64 {
        // SAFETY: valid buffer type.
        unsafe { sys::ggml_backend_buft_get_max_size(self.buft()) as u64 }
    }

    /// Allocates a buffer of the default buffer type; `None` when ggml cannot.
    pub fn alloc_buffer(&self, size: u64) -> Option<Buffer> {
        let size = usize::try_from(size).ok()?;
        // SAFETY: valid buffer type; ggml returns NULL on failure, which Buffer::from_raw handles.
        let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(self.buft(), size) };
        Buffer::from_raw(raw)
    }

    /// Whether the device can run the op of `t` (`ggml_backend_dev_supports_op`). Callers pass a
    /// node whose sources required by its op exist (the CPU implementation dereferences them).
    pub(crate) fn supports_op(&self, t: *const sys::ggml_tensor) -> bool {
        // SAFETY: valid device; t is a live tensor validated by the session.
        unsafe { sys::ggml_backend_dev_supports_op(self.raw, t) }
    }

    /// Whether the device's backends can compute with tensors in `buffer`
    /// (`ggml_backend_dev_supports_buft`: the CPU computes only with host memory).
    pub(crate) fn supports_buffer(&self, buffer: &BufferRef) -> bool {
        let (raw, _) = buffer.raw_parts();
        // SAFETY: valid device; raw is a live buffer (kept alive by `buffer`); only its type is
        // read.
        unsafe {
            sys::ggml_backend_dev_supports_buft(self.raw, sys::ggml_backend_buffer_get_type(raw))
        }
    }

    pub(crate) fn default_buft_raw(&self) -> sys::ggml_backend_buffer_type_t {
        self.buft()
    }

    pub(super) fn raw(&self) -> sys::ggml_backend_dev_t {
        self.raw
    }
}

/// Loads dynamically built backends (no-op in a static build) from `path`, once per process,
/// and installs the `GGML_ASSERT` callback (`abort.rs`). The program passes upstream's
/// `GGML_BACKEND_PATH`, read once at start-up (`ServerOptions::backend_path`); `None` loads none.
pub fn load_backends_from(path: Option<&str>) {
    super::abort::install();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(path) = path {
            if let Ok(p) = CString::new(path) {
                // SAFETY: p is a valid NUL-terminated path string that outlives the call.
                unsafe { sys::ggml_backend_load_all_from_path(p.as_ptr()) };
            }
        }
    });
}

/// `load_backends_from` without a path (a library user's, e.g. the tests' in-process server;
/// the program reads `GGML_BACKEND_PATH` into its options instead).
pub fn load_backends() {
    load_backends_from(None);
}
