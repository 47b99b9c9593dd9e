"""A disaggregated deployment's KV link, derived from the model and the GPU
(README "Disaggregated prefill and decode"; docs/deployment.md "KV transfer").

servesim's link is one per prefill GPU (servesim/engine/kv_handoff.py): each
GPU of a prefill worker sends the KV its own TP rank computed. So a token
costs the link the KV bytes of one GPU, `kv_bytes_per_token` of the capacity
derivation: the pipeline stage's layers × the KV heads one TP rank holds ×
head dim × 2 (K and V) × the KV cache dtype's bytes (an MLA model: its
latent per layer). The link's speed is the prefill GPU's NIC
(`GPUSpec.kv_link_gbps`, servesim/deployment/gpus.py).
"""

from servesim.deployment.config import DeploymentConfig


def link_defaults(dep: DeploymentConfig) -> dict:
    """`{bytes_per_token, bandwidth_gbps}` of the prefill pool's deployment."""
    from servesim.deployment.kv_capacity import gpu_spec, kv_bytes_per_token
    from servesim.deployment.specs import load_model_spec

    return {"bytes_per_token": kv_bytes_per_token(load_model_spec(dep.model), dep),
            "bandwidth_gbps": gpu_spec(dep.gpu).kv_link_gbps}
