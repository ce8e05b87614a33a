# Child warm-up, tiers that preload pandas: a DataFrame built, grouped and aggregated, a
# value printed (the common path of a pandas job), so a request's first groupby does not
# pay pandas' lazily built internals in this fresh process. Kept small: every worker pays
# it. Deterministic, no random generator.
import numpy as np
import pandas as pd

df = pd.DataFrame({"k": np.arange(100) % 7, "v": np.arange(100.0)})
print(df.groupby("k")["v"].sum().iloc[3])
