"""`new_token_ratio` (`NewTokenRatioTracker`; docs/sglang.md, "new_token_ratio"):
the share of their remaining output the scheduler reserves for running
requests without ignore_eos."""

from servesim.sglang.config import (INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO_FACTOR,
                                    NEW_TOKEN_RATIO_DECAY_STEPS, RETRACT_DECODE_STEPS)


class NewTokenRatioTracker:
    """Starts at `min(0.7 x schedule_conservativeness, 1)`; each decode pass
    without retraction lowers it by `(init - min) / 600` down to `init x 0.14`;
    a retraction sets it (`estimate_new_token_ratio_after_retract`); a fully
    idle engine resets it."""

    def __init__(self, schedule_conservativeness: float):
        self.init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min = self.init * MIN_NEW_TOKEN_RATIO_FACTOR
        self.step = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def decay(self):
        self.value = max(self.value - self.step, self.min)

    def reset(self):
        self.value = self.init


def estimate_new_token_ratio_after_retract(kept) -> float:
    """`min(1, (generated + 20 n) / (sum of max_new_tokens + 1))` over the n
    requests a retraction kept."""
    decoded = sum(r.num_outputs for r in kept)
    limit = sum(r.max_new_tokens for r in kept)
    return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (limit + 1))
