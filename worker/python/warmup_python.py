# Child warm-up, every tier: the path nearly every job takes (compile, run a little
# pure Python, print, display the last expression), so a fresh worker pays its
# copy-on-write faults and cold caches here, before it says Ready.
# Run through the runner as a job in a throwaway __main__; its output is discarded.
squares = {i: i * i for i in range(20)}
words = " ".join(f"{k}={v}" for k, v in squares.items() if k % 3 == 0).split()
try:
    int("not a number")
except ValueError as exc:
    message = str(exc)
print(len(words), sum(squares.values()), message[:10])
sorted(words, key=len)[-1]
