# Child warm-up, tiers that preload numpy: array creation, arithmetic, reductions and a
# matrix product, displayed, so the first numpy job of a request runs on warm caches.
# Deterministic: it never touches a random generator (the child reseeds them after).
import numpy as np

a = np.arange(600, dtype=np.float64).reshape(30, 20)
b = (a @ a.T).diagonal()
c = np.sqrt(a).mean(axis=0) + np.where(a > 300, 1.0, 0.0).sum(axis=1).max()
print(b.shape, round(float(c.sum()), 3), int(np.argmax(b)))
np.linspace(0.0, 1.0, 5)
