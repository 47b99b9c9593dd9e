"""GPU specs for the KV-capacity derivation (docs/deployment.md).

Memory figures per GPU, taken from the system files of NVIDIA's
aiconfigurator-core 0.12.0 (Apache-2.0): `hbm_bytes` the memory capacity the
database assumes, `nccl_bytes` NCCL's buffers by tensor-parallel size,
`runtime_bytes` the CUDA context, cuBLAS workspaces and CUDA graphs that
vLLM's profiling sees as non-torch memory. They are built in so a capacity
can be derived without the package; pass times need the package itself.
"""

import attrs

_NCCL = {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}
_RUNTIME = 3758096384  # 3.5 GiB


@attrs.frozen
class GPUSpec:
    name: str
    hbm_bytes: int
    runtime_bytes: int = _RUNTIME

    def nccl_bytes(self, tensor_parallel_size: int) -> int:
        """NCCL buffers for a TP group (the database's figure at min(tp, 8))."""
        tp = min(tensor_parallel_size, 8)
        for size in (8, 4, 2, 1):
            if tp >= size:
                return _NCCL[size]
        return 0


GPUS = {
    spec.name: spec
    for spec in (
        GPUSpec("a100_sxm", 85899345920),
        GPUSpec("h100_sxm", 85899345920),
        GPUSpec("h200_sxm", 151397597184),
        GPUSpec("b200_sxm", 193273528320),
        GPUSpec("b300_sxm", 288400343040),
        GPUSpec("gb200", 198674743296),
        GPUSpec("gb300", 298013687808),
        GPUSpec("l40s", 48305799168),
        GPUSpec("rtx_pro_6000_server", 102641958912),
    )
}
