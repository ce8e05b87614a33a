# Child warm-up, tiers that preload pandas: build a DataFrame, group, aggregate, display
# it (the rich HTML/plain bundle), so a request's first groupby does not pay pandas'
# lazily built internals in this fresh process. Deterministic, no random generator.
import numpy as np
import pandas as pd

df = pd.DataFrame({"k": np.arange(500) % 7, "v": np.arange(500.0), "s": ["x", "y"] * 250})
total = df.groupby("k")["v"].sum()
summary = df.groupby(["k", "s"]).agg(n=("v", "size"), mean=("v", "mean")).reset_index()
merged = summary.merge(total.rename("total"), left_on="k", right_index=True)
print(total.iloc[3], len(merged), df["v"].describe()["mean"])
merged.sort_values("total").head()
