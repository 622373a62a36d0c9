//! From burn's gradients to the wgpu buffer ranges that hold them, and back.
//!
//! A gradient in `GradientsParams` is a fusion tensor of burn's wgpu backend
//! (`Fusion<CubeBackend>`): an id in the fusion server, whose storage is a
//! cubecl handle, a range of a `wgpu::Buffer` in cubecl's memory pool.
//! Resolving a *clone* of the fusion tensor runs the fusion stream up to it
//! and hands back the cubecl tensor while the original stays registered, so
//! the optimizer later reads the very memory gradclip clipped in place.

use burn::backend::fusion::{FusionTensor, NoOp};
use burn::backend::ir::{BackendIr, InitOperationIr, OperationIr};
use burn::backend::wgpu::{AutoCompiler, CubeBackend, CubeTensor, Wgpu, WgpuResource};
use burn::backend::{BackendTypes, StreamId};
use burn::cubecl::wgpu::WgpuServer;
use burn::optim::GradientsParams;
use burn::tensor::DType;
use burn::Tensor;
use gradclip::GradType;

use crate::error::{Error, Result};
use crate::params::ParamInfo;

/// burn's float tensor primitive on the wgpu backend.
pub(crate) type Fused = <Wgpu as BackendTypes>::FloatTensorPrimitive;

/// The resource of a cubecl handle, and cubecl's guard that keeps the
/// allocation alive and in place while held.
pub(crate) struct Held {
    pub resource: WgpuResource,
    _guard: Box<dyn std::any::Any>,
}

/// One gradient taken out of `GradientsParams` for the clip.
pub(crate) struct Taken {
    pub param: usize,
    pub rank: usize,
    /// The tensor that goes back into `GradientsParams`.
    pub fused: Fused,
    /// Its cubecl view: the same storage.
    pub cube: CubeTensor,
    pub dtype: GradType,
}

macro_rules! by_rank {
    ($rank:expr, $d:ident => $body:expr, $other:expr) => {
        match $rank {
            1 => {
                const $d: usize = 1;
                $body
            }
            2 => {
                const $d: usize = 2;
                $body
            }
            3 => {
                const $d: usize = 3;
                $body
            }
            4 => {
                const $d: usize = 4;
                $body
            }
            5 => {
                const $d: usize = 5;
                $body
            }
            6 => {
                const $d: usize = 6;
                $body
            }
            7 => {
                const $d: usize = 7;
                $body
            }
            8 => {
                const $d: usize = 8;
                $body
            }
            _ => $other,
        }
    };
}

fn grad_type(dtype: DType) -> Option<GradType> {
    match dtype {
        DType::F32 => Some(GradType::F32),
        DType::F16 => Some(GradType::F16),
        DType::BF16 => Some(GradType::Bf16),
        _ => None,
    }
}

/// Takes the gradient of `info` (parameter `index`) out of `grads`, if it has one.
pub(crate) fn take(
    grads: &mut GradientsParams,
    info: &ParamInfo,
    index: usize,
) -> Result<Option<Taken>> {
    let fused: Option<Fused> = by_rank!(info.rank, D => {
        match grads.remove::<D>(info.id) {
            None => None,
            Some(tensor) => Some(tensor.try_into_primitive::<Wgpu>().map_err(|e| Error::NotWgpu {
                param: info.path.clone(),
                reason: format!("{e:?}"),
            })?),
        }
    }, return Err(Error::NotWgpu { param: info.path.clone(), reason: format!("rank {} is above 8", info.rank) }));
    let Some(fused) = fused else {
        return Ok(None);
    };
    let dtype = grad_type(fused.dtype).ok_or_else(|| Error::UnsupportedDType {
        param: info.path.clone(),
        dtype: format!("{:?}", fused.dtype),
    })?;
    // Resolving a clone leaves `fused` registered: its storage is shared.
    let cube = fused
        .client
        .resolve_tensor_float::<CubeBackend>(fused.clone());
    Ok(Some(Taken {
        param: index,
        rank: info.rank,
        fused,
        cube,
        dtype,
    }))
}

/// Puts a gradient back into `grads`.
pub(crate) fn give_back(grads: &mut GradientsParams, info: &ParamInfo, taken: Taken) {
    by_rank!(taken.rank, D => {
        grads.register::<D>(info.id, Tensor::<D>::from_primitive::<Wgpu>(taken.fused));
    }, unreachable!("take() accepts ranks 1 to 8 only"));
}

/// Replaces a gradient by a contiguous copy of its own, registered with
/// fusion as a fresh tensor (as burn's own `float_from_data` registers one).
/// For the rare gradient that is a strided view, or that shares its storage
/// with another gradient: gradclip scales each range in place, once.
pub(crate) fn own_copy(taken: &mut Taken) {
    let copy = if taken.cube.is_contiguous() {
        taken.cube.copy()
    } else {
        burn_cubecl::kernel::into_contiguous(taken.cube.clone())
    };
    let client = taken.fused.client.clone();
    let shape = taken.fused.shape.clone();
    let dtype = taken.fused.dtype;
    let handle = <CubeBackend as BackendIr>::float_tensor_handle(copy.clone());
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    let mut out: Vec<FusionTensor<_>> = client.register(
        StreamId::current(),
        OperationIr::Init(desc),
        NoOp::<CubeBackend>::new(),
    );
    taken.fused = out.pop().expect("an init operation has one output");
    taken.cube = copy;
}

/// The bytes a gradient's elements occupy.
pub(crate) fn bytes(taken: &Taken, elements: usize) -> u64 {
    (elements * taken.cube.dtype.size()) as u64
}

/// The wgpu resource that holds `taken`'s storage, kept in place while held.
pub(crate) fn resource(taken: &Taken, path: &str) -> Result<Held> {
    let managed = taken
        .cube
        .client
        .get_resource::<WgpuServer<AutoCompiler>>(taken.cube.handle.clone())
        .map_err(|e| Error::Storage {
            param: path.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(Held {
        resource: managed.resource().clone(),
        _guard: Box::new(managed),
    })
}

/// Submits burn's queued work on the calling thread's stream and on every
/// stream that created one of the gradients, so that what the backward pass
/// wrote is in the queue before gradclip's commands.
pub(crate) fn flush(taken: &[Taken]) -> Result<()> {
    let Some(first) = taken.first() else {
        return Ok(());
    };
    let client = &first.cube.client;
    client.flush().map_err(|e| Error::Flush(e.to_string()))?;
    let current = StreamId::current();
    let mut flushed = vec![current];
    for t in taken {
        let stream = t.cube.handle.stream;
        if !flushed.contains(&stream) {
            flushed.push(stream);
            stream
                .executes(|| t.cube.client.flush())
                .map_err(|e| Error::Flush(e.to_string()))?;
        }
    }
    Ok(())
}
