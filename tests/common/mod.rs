//! Shared test support: the GPU device, upload and readback of gradient
//! buffers, the float64 reference and the golden data.
// Each test binary uses a different part of this module.
#![allow(dead_code, unused_imports)]

pub mod adaptive_reference;
pub mod buffers;
pub mod checks;
pub mod golden;
pub mod layouts;
pub mod reference;

use std::sync::{Arc, Mutex, OnceLock};

pub use buffers::{upload, GRAD_USAGE};
pub use reference::rel_diff;

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub clipper: gradclip::Clipper,
}

/// The adapter wgpu picks from the environment. No adapter is a failure,
/// never a skip: a test that cannot reach a GPU proves nothing.
pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        let (device, queue, info) = pollster::block_on(gradclip::default_device())
            .unwrap_or_else(|e| panic!("no wgpu adapter for the GPU tests: {e}"));
        if let Ok(wanted) = std::env::var("WGPU_BACKEND") {
            let got = format!("{:?}", info.backend).to_lowercase();
            assert!(
                wanted
                    .to_lowercase()
                    .split(',')
                    .any(|w| got.starts_with(w.trim())),
                "WGPU_BACKEND={wanted} but the adapter is on {got}"
            );
        }
        eprintln!(
            "adapter: {} ({:?}, {:?})",
            info.name, info.backend, info.device_type
        );
        watch_errors(&device);
        let clipper = gradclip::Clipper::new(&device, &queue).expect("Clipper::new");
        Gpu {
            device,
            queue,
            info,
            clipper,
        }
    })
}

/// A clipper of `device` forced onto the packed f16 path
/// ([`gradclip::Clipper::without_shader_f16`]), where its f16 path differs
/// from the default clipper's: `None` on a device without shader-f16, whose
/// default clipper takes the packed path already. Each clipper compiles
/// its own pipelines (a per-tensor reduce pipeline takes 5-8 s on
/// SwiftShader), so a second one there would only compile the same ones.
pub fn forced_packed_clipper_of(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
) -> Option<gradclip::Clipper> {
    if !device.features().contains(wgpu::Features::SHADER_F16) {
        return None;
    }
    let packed =
        gradclip::Clipper::without_shader_f16(device, queue).expect("Clipper::without_shader_f16");
    assert_eq!(packed.f16_path(), gradclip::ElementPath::F16Packed);
    Some(packed)
}

/// [`forced_packed_clipper_of`] the shared device, one per test process so
/// that its pipelines compile once.
pub fn forced_packed_clipper() -> Option<&'static gradclip::Clipper> {
    static PACKED: OnceLock<Option<gradclip::Clipper>> = OnceLock::new();
    PACKED
        .get_or_init(|| {
            let g = gpu();
            forced_packed_clipper_of(&g.device, &g.queue)
        })
        .as_ref()
}

/// wgpu errors that reached the device's uncaptured-error handler: gradclip
/// must never let one through, so every GPU helper asserts there are none.
static UNCAPTURED: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub fn watch_errors(device: &wgpu::Device) {
    device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
        UNCAPTURED.lock().unwrap().push(e.to_string());
    }));
}

pub fn assert_no_wgpu_errors() {
    let errors = UNCAPTURED.lock().unwrap();
    assert!(
        errors.is_empty(),
        "wgpu errors reached the uncaptured handler: {errors:#?}"
    );
}

/// A second device on the same adapter whose storage bindings are capped at
/// `max_binding` bytes, with its own clipper: gradients then need many
/// binding windows.
pub fn device_with_binding_limit(
    max_binding: u64,
) -> (wgpu::Device, wgpu::Queue, gradclip::Clipper) {
    let (device, queue, clipper) = device_with_limits("small-binding device", |l| {
        l.max_storage_buffer_binding_size = max_binding;
    });
    assert_eq!(device.limits().max_storage_buffer_binding_size, max_binding);
    (device, queue, clipper)
}

/// A second device on the same adapter with the adapter's limits as `edit`
/// changes them, its errors watched like the shared device's, and its own
/// clipper.
pub fn device_with_limits(
    label: &str,
    edit: impl FnOnce(&mut wgpu::Limits),
) -> (wgpu::Device, wgpu::Queue, gradclip::Clipper) {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .expect("adapter");
    let mut limits = adapter.limits();
    edit(&mut limits);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some(label),
        required_limits: limits,
        ..Default::default()
    }))
    .expect(label);
    watch_errors(&device);
    let clipper = gradclip::Clipper::new(&device, &queue).expect("Clipper::new");
    (device, queue, clipper)
}

pub fn download(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &wgpu::Buffer,
    len: usize,
) -> Vec<f32> {
    if len == 0 {
        return Vec::new();
    }
    let staging = buffers::copy_for_readback(device, queue, buffer, len);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map readback"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    buffers::read_mapped(&staging)
}

/// Every whole f32 word of `buffer`.
pub fn download_all(device: &wgpu::Device, queue: &wgpu::Queue, buffer: &wgpu::Buffer) -> Vec<f32> {
    download(device, queue, buffer, (buffer.size() / 4) as usize)
}

/// A norm clip at `max_norm` under TensorFlow's semantics when `tensorflow`,
/// PyTorch's otherwise: the tests that cover both build it here.
pub fn framework_clip(tensorflow: bool, max_norm: f32) -> gradclip::ClipNorm {
    if tensorflow {
        gradclip::ClipNorm::tensorflow(max_norm)
    } else {
        gradclip::ClipNorm::new(max_norm)
    }
}

/// Runs `record` on a fresh encoder, submits it, and returns the report (or
/// the error) of the latest clip together with the gradients afterwards.
pub fn run_clip(
    data: &[f32],
    sizes: &[usize],
    record: impl FnOnce(&gradclip::GradSet, &mut wgpu::CommandEncoder) -> gradclip::Result<()>,
) -> (gradclip::Result<gradclip::ClipReport>, Vec<f32>) {
    let g = gpu();
    let buffer = upload(&g.device, data);
    let layout = gradclip::GradLayout::from_sizes(sizes).expect("layout");
    let set = g.clipper.bind(&buffer, &layout).expect("bind");
    let mut encoder = g.device.create_command_encoder(&Default::default());
    record(&set, &mut encoder).expect("record");
    g.queue.submit([encoder.finish()]);
    let report = pollster::block_on(set.read_report());
    let after = download(&g.device, &g.queue, &buffer, data.len());
    assert_no_wgpu_errors();
    (report, after)
}

/// A device of its own with its own error sink, for tests that provoke wgpu
/// errors on purpose (a rejected submission) or destroy the device: the
/// shared device's handler must stay clean for every other test.
pub struct OwnGpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub clipper: gradclip::Clipper,
    pub errors: Arc<Mutex<Vec<String>>>,
}

pub fn own_gpu() -> OwnGpu {
    let (device, queue, _) =
        pollster::block_on(gradclip::default_device()).expect("a second device");
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        sink.lock().unwrap().push(e.to_string());
    }));
    let clipper = gradclip::Clipper::new(&device, &queue).expect("Clipper::new");
    OwnGpu {
        device,
        queue,
        clipper,
        errors,
    }
}

/// Two devices of one instance and adapter, the first with a clipper: for
/// handing gradclip objects of the other device.
pub fn two_devices() -> (OwnGpu, wgpu::Device) {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))
    .expect("adapter");
    let request = || {
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("one of two devices"),
            required_limits: adapter.limits(),
            ..Default::default()
        }))
        .expect("device")
    };
    let (device, queue) = request();
    let (other, _) = request();
    let errors = Arc::new(Mutex::new(Vec::new()));
    for d in [&device, &other] {
        let sink = errors.clone();
        d.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().unwrap().push(e.to_string());
        }));
    }
    let clipper = gradclip::Clipper::new(&device, &queue).expect("Clipper::new");
    (
        OwnGpu {
            device,
            queue,
            clipper,
            errors,
        },
        other,
    )
}
