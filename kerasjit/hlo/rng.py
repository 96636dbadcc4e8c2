"""The evaluator's rng-bit-generator: XLA's Philox and ThreeFry bit
generators on numpy words, with their state updates."""
import numpy as np

from .elementwise import UINT
from .philox import philox4x32


def _philox4x32(counters, key):
    """Philox-4x32-10 of counters [n, 4] (u32 words in u64) under key (k0, k1)."""
    mask, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)

    def mul_hi_lo(word, multiplier):
        product = word * np.uint64(multiplier)
        return product >> s32, product & mask
    words = philox4x32([counters[:, i] for i in range(4)], [np.uint64(k) for k in key],
                       mul_hi_lo, np.bitwise_xor, lambda k, step: (k + np.uint64(step)) & mask)
    return np.stack(words, axis=1).astype(np.uint32)


def _split_u64(x):
    return x & np.uint64(0xFFFFFFFF), x >> np.uint64(32)


def _philox_bits(state, dims, wide):
    """XLA's PhiloxBitGenerator: state u64[3] = (key, counter low, counter high).
    Block i runs on the 128-bit counter + i; its four u32 words fill the output
    in order (a 64-bit element takes two words, low first). The new state's
    counter is advanced by the number of blocks."""
    key, lo, hi = state[0], state[1], state[2]
    words = int(np.prod(dims, dtype=np.int64)) * (2 if wide else 1)
    blocks = -(-words // 4)
    block_lo = lo + np.arange(blocks, dtype=np.uint64)
    block_hi = hi + (block_lo < lo)                    # carry into the high half
    counters = np.stack(_split_u64(block_lo) + _split_u64(block_hi), axis=1)
    bits = _philox4x32(counters, (int(key) & 0xFFFFFFFF, int(key) >> 32)).reshape(-1)[:words]
    new_state = state.copy()
    new_state[1] = lo + np.uint64(blocks)
    new_state[2] = hi + (new_state[1] < lo)
    return new_state, bits.view(np.uint64 if wide else np.uint32).reshape(dims)


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(x0, x1, key):
    """Threefry-2x32 with 20 rounds, on u32 arrays, as XLA's prng.cc."""
    k0, k1 = np.uint32(int(key) & 0xFFFFFFFF), np.uint32(int(key) >> 32)
    ks = (k0, k1, np.uint32(0x1BD11BDA) ^ k0 ^ k1)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _threefry_bits(state, dims, wide):
    """XLA's ThreeFryBitGenerator: state u64[2] = (key, counter). A 64-bit
    element i is the block of counter + i. For 32 bits, one dim (the first even
    one, else the first largest) is halved; block j of the halved shape gives
    the element pair (2j, 2j + 1) along that dim."""
    key, counter = state[0], state[1]

    def blocks(shape):
        c = counter + np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64)
        x0, x1 = _threefry2x32(*(w.astype(np.uint32) for w in _split_u64(c)), key)
        return x0.reshape(shape), x1.reshape(shape)
    if wide:
        x0, x1 = blocks(dims)
        bits, used = x0.astype(np.uint64) | (x1.astype(np.uint64) << np.uint64(32)), x0.size
    elif not dims:
        bits, used = blocks(())[0], 1
    else:
        even = [d for d, n in enumerate(dims) if n % 2 == 0]
        split = even[0] if even else int(np.argmax(dims))
        half = list(dims)
        half[split] = -(-dims[split] // 2)
        x0, x1 = blocks(half)
        pairs = np.stack([x0, x1], axis=split + 1)
        half[split] *= 2
        bits = pairs.reshape(half)[tuple(slice(0, n) for n in dims)]
        used = x0.size
    new_state = state.copy()
    new_state[1] = counter + np.uint64(used)
    return new_state, bits


_RNG_ALGORITHMS = {"rng_philox": _philox_bits, "rng_default": _philox_bits,
                   "rng_three_fry": _threefry_bits}


def rng_bit_generator(inst, state):
    algorithm = inst.attrs.get("algorithm", "rng_default")
    if algorithm not in _RNG_ALGORITHMS:
        raise NotImplementedError(f"evaluator: rng-bit-generator algorithm={algorithm}")
    shape = inst.shape.tuple_shapes[1]
    dtype = shape.numpy_dtype
    if dtype.itemsize not in (1, 2, 4, 8) or dtype.kind in "bc":
        raise NotImplementedError(f"evaluator: rng-bit-generator of {shape.dtype} bits")
    new_state, bits = _RNG_ALGORITHMS[algorithm](state, shape.dims, dtype.itemsize == 8)
    # Narrow types keep the low bits of 32-bit draws, as XLA does.
    return new_state, bits.astype(UINT[dtype.itemsize]).view(dtype)
