"""Preemption under SGLang: `ScheduleBatch.retract_decode` (docs/sglang.md,
"Retraction")."""

from servesim.sglang.new_token_ratio import estimate_new_token_ratio_after_retract
from servesim.sglang.req import slots_of


def retract_decode(scheduler, reqs):
    """Order the decode batch by (generated tokens, -prompt length),
    descending; take the last one out (at least once, keeping at least one)
    until the decode of the rest fits. Returns `(kept, in that order;
    retracted, in retraction order; the new ratio)`."""
    order = sorted(reqs, key=lambda r: (r.num_outputs, -r.prompt_len), reverse=True)
    retracted = []
    first = True
    while first or not scheduler.check_decode_mem(slots_of(order)):
        if len(order) == 1:
            break
        first = False
        req = order.pop()
        retracted.append(req)
        scheduler.release_req(req, len(order))
    return order, retracted, estimate_new_token_ratio_after_retract(order)
