# Child warm-up, tiers that preload numpy: the common path of a numpy job (array creation,
# arithmetic, a reduction, printing a result), so a request's first numpy code runs on
# warm caches. Kept small: every worker pays it, in the background but on the same CPUs.
# Deterministic: it never touches a random generator (the child reseeds them after).
import numpy as np

a = np.arange(200, dtype=np.float64)
print((a * 2.0 + 1.0).sum(), a.reshape(20, 10).mean(axis=0)[3])
