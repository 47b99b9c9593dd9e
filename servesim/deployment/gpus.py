"""GPU specs for the KV-capacity derivation (docs/deployment.md).

Memory figures per GPU, taken from the system files of NVIDIA's
aiconfigurator-core 0.12.0 (Apache-2.0): `hbm_bytes` the memory capacity the
database assumes, `nccl_bytes` NCCL's buffers by tensor-parallel size,
`runtime_bytes` the CUDA context, cuBLAS workspaces and CUDA graphs that
vLLM's profiling sees as non-torch memory. They are built in so a capacity
can be derived without the package; pass times need the package itself.

`kv_link_gbps` is the GB/s of the network link each GPU sends a
disaggregated deployment's KV over (`cluster.kv_transfer.bandwidth_gbps`
when not given): one NIC per GPU as in NVIDIA's reference systems, per their
datasheets — DGX A100: ConnectX-6 at 200 Gb/s per GPU; DGX H100, DGX H200
and DGX B200: ConnectX-7 at 400 Gb/s; DGX B300: ConnectX-8 at 800 Gb/s;
GB200 NVL72: ConnectX-7 at 400 Gb/s per GPU; GB300 NVL72: ConnectX-8 at
800 Gb/s; RTX PRO servers: a ConnectX-8 (800 Gb/s) per two GPUs. L40S
servers have no such reference design: 200 Gb/s per GPU is assumed.
docs/deployment.md ("KV transfer") says which figures are assumptions.
"""

import attrs

_NCCL = {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}
_RUNTIME = 3758096384  # 3.5 GiB


@attrs.frozen
class GPUSpec:
    name: str
    hbm_bytes: int
    kv_link_gbps: float  # GB/s of the GPU's NIC (1 GB/s = 8 Gb/s)
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
        GPUSpec("a100_sxm", 85899345920, 25.0),
        GPUSpec("h100_sxm", 85899345920, 50.0),
        GPUSpec("h200_sxm", 151397597184, 50.0),
        GPUSpec("b200_sxm", 193273528320, 50.0),
        GPUSpec("b300_sxm", 288400343040, 100.0),
        GPUSpec("gb200", 198674743296, 50.0),
        GPUSpec("gb300", 298013687808, 100.0),
        GPUSpec("l40s", 48305799168, 25.0),
        GPUSpec("rtx_pro_6000_server", 102641958912, 50.0),
    )
}
