//! Backend instances: a device's stream and thread pool, which computes graphs. The top of the
//! layer (`lib.rs` lists the order): it runs a [`Graph`] on a [`Device`], and adds
//! `Device::init_backend` here, so that devices stay below graphs.

use super::device::{Device, DeviceKind};
use super::graph::{Graph, GraphError};
use super::sys;

/// A backend instance: executes graphs on one device. Owned by one session at a time.
pub struct Backend {
    raw: sys::ggml_backend_t,
    /// The device it runs on, and its name.
    dev: sys::ggml_backend_dev_t,
    device: String,
}

// SAFETY: a backend instance is used by one thread at a time (the owning session holds it by
// value / &mut); ggml backends may be moved between threads.
unsafe impl Send for Backend {}

impl Device {
    /// Creates a backend instance (stream, thread pool) on this device.
    pub fn init_backend(&self, n_threads: usize) -> Option<Backend> {
        // SAFETY: valid device; NULL params selects the defaults; NULL return handled below.
        let raw = unsafe { sys::ggml_backend_dev_init(self.raw(), std::ptr::null()) };
        if raw.is_null() {
            return None;
        }
        if self.kind() == DeviceKind::Cpu {
            let n = i32::try_from(n_threads.max(1)).unwrap_or(i32::MAX);
            // SAFETY: raw is a freshly created CPU backend.
            unsafe { sys::ggml_backend_cpu_set_n_threads(raw, n) };
        }
        Some(Backend {
            raw,
            dev: self.raw(),
            device: self.name().to_string(),
        })
    }
}

impl Backend {
    /// Runs `graph` on this backend: each segment after its index checks passed, so that no
    /// kernel reads an index out of its range. Stops at the first refusal or failure (the
    /// segments before it have run). Refused for a graph built for another device (its rules
    /// were that device's).
    pub fn compute(&mut self, graph: &mut Graph) -> Result<(), GraphError> {
        graph.check_device(self.dev, &self.device)?;
        let started = std::time::Instant::now();
        for seg in 0..graph.segments() {
            self.compute_segment(graph, seg)?;
        }
        tracing::trace!(
            segments = graph.segments(),
            run_us = started.elapsed().as_micros() as u64,
            "graph run"
        );
        Ok(())
    }

    /// Runs segment `segment` of `graph` once its index checks passed.
    fn compute_segment(&mut self, graph: &mut Graph, segment: usize) -> Result<(), GraphError> {
        let (g, _locked) = graph.checked_segment(segment)?;
        // SAFETY: self.raw is live; the graph's tensors point into its own context and into
        // buffers the graph keeps alive (BufferRef) and whose flags `_locked` holds exclusively,
        // so no Rust view of their bytes exists while ggml writes them; every node passed its
        // op's rule and every index tensor this segment reads passed its check under `_locked`, so
        // no kernel leaves its tensors (`Graph::build`).
        let status = unsafe { sys::ggml_backend_graph_compute(self.raw, g) };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(GraphError::ComputeFailed {
                device: self.device.clone(),
                status: status as i32,
            })
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: raw came from ggml_backend_dev_init and is freed exactly once.
        unsafe { sys::ggml_backend_free(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BufferRef, GraphLinks, TensorSpec};
    use rpc_proto::{ggml_op, ggml_type};

    fn cpu() -> Device {
        Device::all()
            .into_iter()
            .find(|d| d.kind() == DeviceKind::Cpu)
            .expect("a CPU device")
    }

    fn f32_spec(buf: &BufferRef, off: u64, op: u32) -> TensorSpec {
        TensorSpec {
            type_: ggml_type::F32,
            ne: [4, 1, 1, 1],
            nb: [4, 16, 16, 16],
            op,
            op_params: [0; 16],
            // ggml's backends run only the nodes flagged for computation.
            flags: if op == ggml_op::NONE {
                0
            } else {
                rpc_proto::TENSOR_FLAG_COMPUTE
            },
            buffer: Some((buf.clone(), off)),
            view_offs: 0,
            name: [0; 64],
        }
    }

    /// ggml writes a graph's buffers only while no view of them is alive: a computation with a
    /// view alive is refused, and runs once the view is gone.
    #[test]
    fn a_graph_is_not_computed_under_a_view_of_its_buffer() {
        let dev = cpu();
        let mut b = dev.alloc_buffer(48).unwrap();
        b.clear(0).unwrap();
        let ones: Vec<u8> = [1.0f32; 8].iter().flat_map(|x| x.to_le_bytes()).collect();
        b.write(0, &ones).unwrap();
        let r = b.share();
        let specs = [
            f32_spec(&r, 0, ggml_op::NONE),
            f32_spec(&r, 16, ggml_op::NONE),
            f32_spec(&r, 32, ggml_op::ADD),
        ];
        let mut links = [GraphLinks::default(); 3];
        links[2].src[0] = Some(0);
        links[2].src[1] = Some(1);
        let mut graph = Graph::build(&specs, &links, &[2], &dev).unwrap();
        assert!(graph.uses(&b));
        let mut backend = dev.init_backend(1).unwrap();
        {
            let view = b.host(32, 16).unwrap();
            assert!(matches!(
                backend.compute(&mut graph),
                Err(GraphError::BufferBusy)
            ));
            assert!(view.iter().all(|&x| x == 0), "nothing was written");
        }
        {
            let _view = b.host_mut(0, 4).unwrap();
            assert!(matches!(
                backend.compute(&mut graph),
                Err(GraphError::BufferBusy)
            ));
        }
        backend.compute(&mut graph).unwrap();
        let mut out = [0u8; 16];
        b.read(32, &mut out).unwrap();
        let sums: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(sums, [2.0; 4]);
        // The flags are given back after each computation.
        assert!(b.host_mut(0, 48).is_some());
    }
}
