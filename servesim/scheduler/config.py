"""Configuration of one rank's vLLM scheduler (vllm/config/scheduler.py)."""

import attrs


@attrs.frozen
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: no limit
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"  # fcfs | priority
    reserve_full_isl: bool = True
    watermark: float = 0.0
    async_scheduling: bool = False
