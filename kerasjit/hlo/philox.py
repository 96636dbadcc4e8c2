"""Philox-4x32-10, XLA's rng-bit-generator, over any arithmetic: the
evaluator runs it on numpy words, the lowering builds it as kernel
expressions (kernels/expressions.py), so both compute the same rounds."""

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_STEPS = (0x9E3779B9, 0xBB67AE85)


def philox4x32(counter, key, mul_hi_lo, xor, add):
    """The 4 output words of 4 counter words under 2 key words, given the
    arithmetic: mul_hi_lo(word, multiplier) -> (high, low) words of the 64-bit
    product, xor(a, b), add(key word, constant) mod 2^32."""
    c, k = list(counter), list(key)
    for _ in range(10):
        hi0, lo0 = mul_hi_lo(c[0], MULTIPLIERS[0])
        hi1, lo1 = mul_hi_lo(c[2], MULTIPLIERS[1])
        c = [xor(xor(hi1, c[1]), k[0]), lo1, xor(xor(hi0, c[3]), k[1]), lo0]
        k = [add(k[0], KEY_STEPS[0]), add(k[1], KEY_STEPS[1])]
    return c
