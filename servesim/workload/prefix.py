"""Trace hash ids -> token-level block identities at the engine's block size.

A trace names its prompt in blocks of `trace_block_size` tokens (`hash_ids`);
two requests share a prefix of k trace blocks iff their first k ids are equal.
Token t of a prompt is therefore determined by the chain of ids up to its trace
block and its offset in that block. The engine caches blocks of `block_size`
tokens, and engine block i of two requests is the same iff their token
prefixes `[0, (i+1)·block_size)` are the same (docs/engine.md §5: vLLM chains
each block's hash from its parent's): its identity is the pair (id chain of the
trace block holding its last token, that token's offset in the trace block).

Blocks that hold any token past the prompt (a partial prompt tail filled by
outputs, or output blocks) are unique to their request and position, so a
request resumed after a preemption can hit its own generated blocks and nobody
else can.

With speculative decoding on and prefix caching on, vLLM hashes each block
together with the first token of the next block (one hash lookahead token,
README.md "Speculative decoding"): engine block i's identity is then that
of the token prefix `[0, (i+1)·block_size + 1)`, and only blocks whose
lookahead token is still a prompt token can be shared (`hash_lookahead=1`).

Identities are dense integers, so the prefix cache can index arrays by them.
"""

import numpy as np

from servesim.jit import njit


def chain_ids(hash_flat: np.ndarray, hash_offsets: np.ndarray) -> np.ndarray:
    """For every trace block, a dense id of the whole chain of hash ids up to
    and including it (equal iff the two prefixes are equal)."""
    counts = np.diff(hash_offsets)
    total = len(hash_flat)
    chain = np.empty(total, dtype=np.int64)
    if total == 0:
        return chain
    position = np.arange(total, dtype=np.int64) - np.repeat(hash_offsets[:-1], counts)
    order = np.argsort(position, kind="stable")
    per_position = np.bincount(position)
    base = int(hash_flat.max()) + 2
    next_id = 0
    start = 0
    for j, count in enumerate(per_position):
        idx = order[start:start + count]
        start += count
        parent = chain[idx - 1] + 1 if j > 0 else np.zeros(count, dtype=np.int64)
        keys = parent * base + (hash_flat[idx] + 1)
        uniq, inverse = np.unique(keys, return_inverse=True)
        chain[idx] = next_id + inverse
        next_id += len(uniq)
    return chain


@njit
def _prompt_identities(chain, hash_offsets, input_length, offsets, block_size,
                       trace_block_size, hash_lookahead, idents):
    """Fill each request's slice: its full prompt blocks get the key (chain id
    of the trace block holding their last token, that token's offset in it);
    every other block gets -1."""
    for r in range(len(input_length)):
        base = offsets[r]
        full = (input_length[r] - hash_lookahead) // block_size
        for k in range(full):
            last = (k + 1) * block_size - 1 + hash_lookahead
            chain_id = chain[hash_offsets[r] + last // trace_block_size]
            idents[base + k] = chain_id * trace_block_size + last % trace_block_size
        for k in range(base + full, offsets[r + 1]):
            idents[k] = -1


def block_identities(hash_flat, hash_offsets, trace_block_size, input_length,
                     num_blocks, block_size, hash_lookahead=0):
    """Identities of every engine block of every request.

    `num_blocks[r]` is how many blocks request r can ever hold (its prompt plus
    its output cap). Returns `(idents, offsets, num_identities)`, where
    `idents[offsets[r]:offsets[r+1]]` are request r's block identities: its
    full prompt blocks first, then blocks unique to it.
    """
    input_length = np.asarray(input_length, dtype=np.int64)
    # every prompt token has its trace block (the trace reader checks it for
    # users' traces); the compiled loop below reads them unchecked
    if np.any(np.diff(hash_offsets) < -(-input_length // trace_block_size)):
        raise ValueError("a request has fewer hash ids than its prompt has trace blocks")
    offsets = np.zeros(len(input_length) + 1, dtype=np.int64)
    np.cumsum(np.asarray(num_blocks, dtype=np.int64), out=offsets[1:])
    chain = chain_ids(hash_flat, hash_offsets)
    idents = np.empty(int(offsets[-1]), dtype=np.int64)
    _prompt_identities(chain, hash_offsets, input_length, offsets, block_size,
                       trace_block_size, hash_lookahead, idents)
    unique = idents < 0
    prompt = ~unique
    if trace_block_size % block_size == 0:
        # a trace block holds a whole number of engine blocks: number them in it;
        # key = chain * tbs + offset, and offset // block_size numbers the block
        idents[prompt] //= block_size
        num_prompt_ids = (int(chain.max()) + 1 if len(chain) else 0) * (trace_block_size // block_size)
    else:
        uniq, inverse = np.unique(idents[prompt], return_inverse=True)
        idents[prompt] = inverse
        num_prompt_ids = len(uniq)
    num_unique = int(np.count_nonzero(unique))
    idents[unique] = num_prompt_ids + np.arange(num_unique, dtype=np.int64)
    num_identities = num_prompt_ids + num_unique
    if num_identities < 2**31:  # halves the largest per-block array of a run
        idents = idents.astype(np.int32)
    return idents, offsets, num_identities
