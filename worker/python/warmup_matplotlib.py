# Child warm-up, tiers that preload matplotlib: draw a small figure and leave it open,
# so the runner renders it to PNG and closes it, as it does a request's figure.
# A fresh child's first figure costs ~40 ms of CPU against ~28 ms in a warm process
# (cold caches, copy-on-write; ~3.5 ms of it reloading the fonts matplotlib's at-fork hook
# drops): this pays the difference before the worker says Ready.
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(2, 1.5))
ax.plot([0, 1, 2, 3], [0, 1, 4, 9], label="squares")
ax.bar([0, 1], [1, 2])
ax.set_title("warm-up")
ax.set_xlabel("x")
ax.legend()
