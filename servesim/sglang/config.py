"""`engine:` under `backend: sglang`: SGLang's server-argument names
(docs/sglang.md, "Config"), and the environment knobs at SGLang's defaults."""

import attrs

# SGLang's environment knobs (docs/sglang.md, "Config"), at their defaults
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
WAITING_PREFIX_REFRESH_EVERY = 32  # _touch_waiting_prefixes: every 32nd fcfs call
WAITING_PREFIX_REFRESH_MAX = 128


@attrs.frozen
class SGLangConfig:
    """SGLang's server arguments (`python -m sglang.launch_server --KEY`).

    `chunked_prefill_size` -1 turns chunked prefill off; `ignore_eos` is the
    sampling parameter of every request (without it a trace row whose
    `max_new_tokens` exceeds its `output_length` stops by EOS there).
    """

    max_total_tokens: int = 65536
    page_size: int = 1
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 4096
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False
    context_length: int = 65536
    ignore_eos: bool = True

    @property
    def chunked_prefill(self) -> bool:
        return self.chunked_prefill_size > 0

    @property
    def max_num_reqs(self) -> int:
        """Request slots: the ReqToTokenPool's rows (`resolve_max_num_reqs`)."""
        return min(self.max_running_requests, self.max_total_tokens // 2)
