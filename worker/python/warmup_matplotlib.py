# Child warm-up, tiers that preload matplotlib: draw a small figure and leave it open,
# so the runner renders it to PNG and closes it, as it does a request's figure.
# matplotlib's own at-fork hook empties its font cache in every child: without this
# the first figure of a request would pay for loading the fonts again (~50 ms).
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(2, 1.5))
ax.plot([0, 1, 2, 3], [0, 1, 4, 9], label="squares")
ax.bar([0, 1], [1, 2])
ax.set_title("warm-up")
ax.set_xlabel("x")
ax.legend()
