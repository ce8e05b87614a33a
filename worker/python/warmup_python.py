# Child warm-up, every tier: the path every job takes through the runner and no more
# (compile, run, print, display the last expression), so a fresh worker pays that path's
# copy-on-write faults and cold caches before it says Ready, and a job pays only for what
# it does beyond it. A broader warm-up (comprehensions, an exception, f-strings, sorting)
# cost every request ~0.6 ms more CPU to save ~0.25 ms on a pure-Python job that used
# them (BENCHMARKS.md, "The child warm-up").
# Run through the runner as a job in a throwaway __main__; its output is discarded.
print(0)
0
